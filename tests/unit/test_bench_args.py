"""The benchmarks' counts are checked where they are read: 0 requests used to end in IndexError,
0 renders in StatisticsError, 0 nodes in a loop of 404s."""

from __future__ import annotations

import pytest

from gpushare_hub.bench import main


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["extender", "--requests", "0"], "argument --requests: 0 is too few; give 1 or more"),
        (["extender", "--nodes", "0"], "argument --nodes: 0 is too few"),
        (["plugin", "--requests", "-1"], "argument --requests: -1 is too few"),
        (["form", "--renders", "0"], "argument --renders: 0 is too few"),
        (["schedule", "--pods", "many"], "argument --pods: 'many' is not a whole number"),
        (["spawn", "--spawns", "0"], "argument --spawns: 0 is too few"),
    ],
)
def test_a_count_below_one_is_refused_before_anything_runs(capsys, argv, words):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and words in capsys.readouterr().err
