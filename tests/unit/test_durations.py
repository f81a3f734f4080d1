"""The one way durations are written (gpushare_hub.core.durations), and the one sentence for a
slice returned for sitting idle on the GPU."""

from __future__ import annotations

import math

from gpushare_hub.core.durations import compact, duration_words, returned_words


def test_durations_read_as_people_write_them():
    cases = (40, 420, 6600, 7200, 100_000, 3 * 86400 + 4 * 3600 + 59, -3, math.nan, math.inf)
    assert [duration_words(s) for s in cases] == [
        "40 s",
        "7 min",
        "1 h 50 min",
        "2 h",
        "27 h 46 min",
        "3 days 4 h",
        "0 s",
        "0 s",
        "0 s",
    ]


def test_the_inspect_table_keeps_kubectls_compact_column():
    assert [compact(s) for s in (45, 420, 7500, 3 * 86400 + 4 * 3600, -1)] == [
        "45s",
        "7m",
        "2h05m",
        "3d4h",
        "0s",
    ]


def test_a_returned_slice_is_said_one_way():
    assert (
        returned_words("5 GiB slice", 7260) == "your 5 GiB slice was returned after 2 h 1 min idle on the GPU"
    )
