"""``gpushare-replay --history FILE --hibernate-after MINUTES [--overcommit FACTOR]``: beside each
what-if the cards needed with hibernation, and the bound for each; the plain figures unchanged;
flags checked before anything runs, naming the flag and the fix."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from gpushare_hub.core.budget import Held
from gpushare_hub.core.history import history_rows, to_csv
from gpushare_hub.replay.cli import main

pytestmark = pytest.mark.unit
T0 = 1_795_000_000.0
HOUR = 3600.0
HIB_KEYS = {
    "peak_cards", "peak_lower_bound", "card_hours", "lower_bound_card_hours", "waited", "waited_pct",
    "wait_median_seconds", "wait_p95_seconds",
}  # fmt: skip


def held(i: int, start: float, hours: float, idle: float | None) -> Held:
    end = start + hours * HOUR
    return Held(
        f"hub/p{i}@1", f"u{i}", 5, start, end, "", "5g", "Tesla-T4", start, ("class",), idle_seconds=idle
    )


@pytest.fixture
def two_idle(tmp_path: Path) -> Path:
    """Four 5 GiB spawns on 15 GiB T4s: two for 4 h, idle 3 h 30 min of it (by the model:
    hibernated from 50 min on), and two at 1 h for 2 h that are never idle."""
    rows = [
        held(0, T0, 4, 3.5 * HOUR),
        held(1, T0 + 1, 4, 3.5 * HOUR),
        held(2, T0 + HOUR, 2, 0.0),
        held(3, T0 + HOUR + 1, 2, None),
    ]
    path = tmp_path / "history.csv"
    path.write_text(to_csv(history_rows(rows, T0 + 86400)))
    return path


@pytest.fixture
def busy(tmp_path: Path) -> Path:
    """Two hundred spawns over a day, a third without an idle measure."""
    rng = random.Random(3)
    rows = []
    for i in range(200):
        idle = None if i % 3 == 0 else float(rng.randrange(0, 3 * 3600))
        rows.append(held(i, T0 + rng.randrange(86400), rng.uniform(0.2, 4), idle))
    path = tmp_path / "busy.csv"
    path.write_text(to_csv(history_rows(rows, T0 + 2 * 86400)))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_hibernating_the_idle_two_saves_a_card_and_the_report_says_so(two_idle, capsys) -> None:
    argv = ("--history", str(two_idle), "--cards", "4x1 Tesla-T4", "--hibernate-after", "20")
    rc, out, _ = run(capsys, *argv)
    assert rc == 0
    assert "peak cards used 2   lower bound (L2) at peak 2" in out
    assert (
        "  with hibernation after 20 min idle, overcommit 2: peak cards used 1 (without: 2)   "
        "lower bound at peak 1 (without: 2)"
    ) in out.splitlines()
    assert "  with hibernation: card-hours " in out and "4 cards: no spawn waits" in out
    assert "idle time taken as the end of each session (a notebook left open after the work): 2 of 4 " in out
    assert "1 with no idle measured are taken as never idle" in out
    assert "held GiB (awake + hibernated) at most 2 x its memory" in out
    rc, out, _ = run(capsys, *argv, "--json")
    doc = json.loads(out)
    (row,) = doc["rows"]
    assert set(row["hibernation"]) == HIB_KEYS
    assert (row["peak_cards"], row["hibernation"]["peak_cards"]) == (2, 1)
    assert (row["peak_lower_bound"], row["hibernation"]["peak_lower_bound"]) == (2, 1)
    assert doc["hibernation"] == {
        "after_minutes": 20,
        "overcommit": 2.0,
        "hibernating_spawns": 2,
        "idle_unmeasured_spawns": 1,
        "model": doc["hibernation"]["model"],
    }
    assert "taken as the end of the session" in doc["hibernation"]["model"]


def test_an_overcommit_of_one_or_a_long_hibernate_after_saves_nothing(two_idle, capsys) -> None:
    argv = ["--history", str(two_idle), "--cards", "4x1 Tesla-T4", "--json"]
    rc, out, _ = run(capsys, *argv, "--hibernate-after", "20", "--overcommit", "1")
    assert rc == 0 and json.loads(out)["rows"][0]["hibernation"]["peak_cards"] == 2
    rc, out, _ = run(capsys, *argv, "--hibernate-after", "240")  # longer than any idle
    doc = json.loads(out)
    assert doc["rows"][0]["hibernation"]["peak_cards"] == 2 and doc["hibernation"]["hibernating_spawns"] == 0


def test_a_history_without_idle_measures_needs_as_many_cards_with_hibernation(tmp_path, capsys) -> None:
    rows = [held(i, T0 + i * 60, 3, None) for i in range(4)]
    path = tmp_path / "h.csv"
    path.write_text(to_csv(history_rows(rows, T0 + 86400)))
    argv = ("--history", str(path), "--cards", "4x1 Tesla-T4", "--hibernate-after", "1", "--json")
    rc, out, _ = run(capsys, *argv)
    doc = json.loads(out)
    (row,) = doc["rows"]
    assert rc == 0 and row["peak_cards"] == row["hibernation"]["peak_cards"] == 2
    assert doc["hibernation"]["hibernating_spawns"] == 0 and doc["hibernation"]["idle_unmeasured_spawns"] == 4


@pytest.mark.parametrize("sweep", [[], ["--sweep", "cards=3..6", "catalogue=3,5,7;5"]])
def test_the_plain_figures_are_the_same_with_the_flag_or_without(busy, capsys, sweep) -> None:
    argv = ["--history", str(busy), "--cards", "4x1 Tesla-T4", *sweep, "--json"]
    rc, out, _ = run(capsys, *argv)
    plain = json.loads(out)
    rc2, out, _ = run(capsys, *argv, "--hibernate-after", "15", "--overcommit", "1.5")
    hib = json.loads(out)
    assert rc == rc2 == 0
    assert "hibernation" not in plain and all("hibernation" not in r for r in plain["rows"])
    assert [{k: v for k, v in r.items() if k != "hibernation"} for r in hib["rows"]] == plain["rows"]
    assert all(r["hibernation"]["peak_lower_bound"] <= r["hibernation"]["peak_cards"] for r in hib["rows"])
    assert hib["hibernation"]["overcommit"] == 1.5 and hib["hibernation"]["idle_unmeasured_spawns"] == 67


def test_a_sweep_shows_the_cards_with_hibernation_in_its_table(busy, capsys) -> None:
    rc, out, err = run(capsys, "--history", str(busy), "--sweep", "cards=3..5", "--hibernate-after", "20")
    assert rc == 0
    head = next(line for line in out.splitlines() if "spawns waiting" in line)
    assert head.split()[-6:] == ["hib", "waiting", "hib", "peak", "hib", "L2"]
    assert "  hib: with hibernation after 20 min idle, overcommit 2" in out.splitlines()
    assert "3/3 5 cards, slices as held, binpack, with hibernation" in err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--hibernate-after", "0"], "argument --hibernate-after: '0' is not a number of minutes above 0"),
        (["--hibernate-after", "-5"], "e.g. --hibernate-after 20"),
        (["--hibernate-after", "soon"], "argument --hibernate-after: 'soon' is not a number of minutes"),
        (["--hibernate-after", "nan"], "argument --hibernate-after: 'nan' is not"),
        (["--hibernate-after", "20", "--overcommit", "0.5"], "--overcommit: '0.5' is not a factor from 1 to"),
        (["--hibernate-after", "20", "--overcommit", "5"], "e.g. --overcommit 2"),
        (["--hibernate-after", "20", "--overcommit", "inf"], "argument --overcommit: 'inf' is not a factor"),
    ],
)  # fmt: skip
def test_a_flag_out_of_range_is_refused_naming_the_flag_and_the_fix(two_idle, capsys, argv, words) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--history", str(two_idle), "--cards", "4x1 Tesla-T4", *argv])
    assert exited.value.code == 2
    assert words in capsys.readouterr().err


def test_the_flags_go_with_a_history_and_overcommit_with_hibernate_after(two_idle, capsys) -> None:
    rc, out, err = run(capsys, "--history", str(two_idle), "--cards", "4x1 Tesla-T4", "--overcommit", "2")
    assert rc == 2 and out == ""
    assert "--overcommit goes with --hibernate-after; give both, e.g. --hibernate-after 20" in err
    rc, out, err = run(capsys, "--hibernate-after", "20")
    assert rc == 2 and out == ""
    assert "--hibernate-after and --overcommit replay the hub's history: give --history FILE" in err
