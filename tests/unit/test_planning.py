"""The what-if replay of the hub's history (core/planning.py), checked against a brute-force count.

The brute force shares nothing with the planner: no ledger, no placer, no event heap. It steps
through every second, releases and places by hand (best fit, oldest waiting spawn first,
lowest card on a tie), and counts cards in use each second. Each of a few hundred synthetic
sessions must wait exactly as long in both, and the card-hours and the peak must agree.
"""

from __future__ import annotations

import math
import random
from functools import cache

import pytest

from gpushare_hub.core.bounds import l2
from gpushare_hub.core.budget import Held
from gpushare_hub.core.history import history_rows, to_csv
from gpushare_hub.core.planning import (
    Plan,
    PlanningError,
    Session,
    figures,
    parse_cards_range,
    parse_catalogue,
    percentile,
    recorded,
    replay,
    row_words,
    session_of,
    sessions_from_held,
    sessions_of,
    sweep,
)

pytestmark = pytest.mark.unit
GIBS = (1, 2, 3, 4.5, 5, 5, 5, 7, 8, 10, 15)


def synthetic(n: int, seed: int, span: int = 30_000) -> list[Session]:
    """``n`` sessions at whole seconds: arrivals spread over ``span`` s, holds of 1 min to 3 h."""
    rng = random.Random(seed)
    sessions = [
        Session(
            arrive=float(rng.randrange(span)),
            hold=float(rng.randrange(60, 3 * 3600)),
            gib=rng.choice(GIBS),
            idle=float(rng.randrange(0, 60)) if rng.random() < 0.5 else None,
        )
        for _ in range(n)
    ]
    return sorted(sessions, key=lambda s: s.arrive)


def brute_force(
    sessions: list[Session], plan: Plan
) -> tuple[list[float | None], int, float, list[list[int]]]:
    """Per session its wait, the peak cards, the card-hours and, each second something is
    held, the sizes held then; by stepping one second at a time."""
    cap = plan.card_gib
    free = [cap] * plan.cards
    sizes = [plan.size(s.gib) for s in sessions]
    held: dict[int, tuple[int, float]] = {}  # session -> (card, release time)
    waits: list[float | None] = [None] * len(sessions)
    queue: list[int] = []
    arriving: dict[int, list[int]] = {}
    for i, s in enumerate(sessions):
        if sizes[i] is not None:
            arriving.setdefault(int(s.arrive), []).append(i)
    peak = 0
    card_seconds = 0
    active: list[list[int]] = []
    horizon = int(max(s.arrive for s in sessions)) + 1
    t = 0
    while t < horizon or held or any(sizes[i] is not None for i in queue):
        for i, (card, until) in list(held.items()):
            if until == t:
                free[card] += sizes[i] or 0
                del held[i]
        queue += arriving.get(t, [])
        for i in sorted(queue):
            size = sizes[i]
            assert size is not None
            fits = [c for c in range(plan.cards) if free[c] >= size]
            if fits:
                card = min(fits, key=lambda c: (free[c] - size, c))
                free[card] -= size
                held[i] = (card, t + sessions[i].hold)
                waits[i] = t - sessions[i].arrive
                queue.remove(i)
        in_use = sum(1 for f in free if f < cap)
        peak = max(peak, in_use)
        card_seconds += in_use
        if held:
            active.append(sorted(sizes[i] or 0 for i in held))
        t += 1
    return waits, peak, card_seconds / 3600, active


def optimum(sizes: tuple[int, ...], cap: int) -> int:
    """The fewest cards that hold ``sizes`` (exhaustive search; a dozen items at most)."""

    @cache
    def best(items: tuple[int, ...], bins: tuple[int, ...]) -> int:
        if not items:
            return len(bins)
        first, rest = items[0], items[1:]
        tried = set()
        answers = [best(rest, tuple(sorted((*bins, cap - first))))]
        for j, room in enumerate(bins):
            if room >= first and room not in tried:
                tried.add(room)
                left = tuple(sorted((*bins[:j], room - first, *bins[j + 1 :])))
                answers.append(best(rest, left))
        return min(answers)

    return best(tuple(sorted(sizes, reverse=True)), ())


@pytest.mark.parametrize(
    ("seed", "cards", "catalogue"),
    [(1, 6, ()), (2, 5, (3, 5, 7)), (3, 8, (4, 8)), (4, 3, (5, 10)), (5, 40, (3, 5, 7))],
)
def test_a_few_hundred_sessions_wait_as_long_as_a_brute_force_count_says(
    seed: int, cards: int, catalogue: tuple[int, ...]
) -> None:
    sessions = synthetic(300, seed)
    plan = Plan(cards=cards, catalogue=catalogue)
    out = replay(sessions, plan)
    waits, peak, card_hours, _ = brute_force(sessions, plan)
    assert out.waits == waits
    assert out.peak_cards == peak
    assert out.card_hours == pytest.approx(card_hours)
    row = figures(sessions, out)
    waited = [w for w in waits if w]
    assert row["waited"] == len(waited)
    assert row["waited_pct"] == round(100 * len(waited) / 300, 2)
    assert row["spawns"] == 300
    if waited:
        ordered = sorted(waited)
        assert row["wait_p95_seconds"] == ordered[math.ceil(0.95 * len(ordered)) - 1]
    if cards == 40:  # room for everyone: nobody waits
        assert row["waited"] == 0 and row["wait_p95_seconds"] is None


def test_the_bound_never_exceeds_the_fewest_cards_that_hold_what_is_held() -> None:
    sessions = synthetic(200, 7, span=40_000)
    plan = Plan(cards=30, catalogue=(3, 5, 7))
    out = replay(sessions, plan)
    _, _, _, active = brute_force(sessions, plan)
    small = [sizes for sizes in active if len(sizes) <= 10]
    assert len(small) > 1000
    for sizes in {tuple(s) for s in small}:
        hist: dict[int, int] = {}
        for s in sizes:
            hist[s] = hist.get(s, 0) + 1
        assert l2(hist, plan.card_gib) <= optimum(sizes, plan.card_gib)
    # Best fit may need more cards than the optimum, never fewer than the bound.
    assert all(b <= c for b, c in zip(out.bounds, out.cards, strict=True))
    assert out.peak_lower_bound <= out.peak_cards


def test_more_cards_never_make_more_spawns_wait_on_this_history() -> None:
    sessions = synthetic(300, 11)
    rows = sweep(sessions, [Plan(cards=n, catalogue=(3, 5, 7)) for n in range(2, 12)])
    waited = [r["waited"] for r in rows]
    assert waited == sorted(waited, reverse=True)
    assert waited[0] > waited[-1]


def test_a_catalogue_rounds_each_session_up_to_the_next_size_offered() -> None:
    plan = Plan(cards=2, catalogue=(4, 8))
    assert [plan.size(g) for g in (1, 4, 4.5, 8, 9, 15, 16)] == [4, 4, 8, 8, 15, 15, None]
    assert [Plan(cards=1).size(g) for g in (0.5, 3, 3.2, 15)] == [1, 3, 4, 15]


def test_the_idle_and_asked_gib_hours_come_from_the_sessions_and_the_sizes_given() -> None:
    sessions = [
        Session(arrive=0, hold=3600, gib=3, idle=1800),
        Session(arrive=0, hold=7200, gib=5),
        Session(arrive=0, hold=3600, gib=20),  # more than a T4 holds
    ]
    row = figures(sessions, replay(sessions, Plan(cards=1, catalogue=(4, 8))))
    assert row["asked_gib_hours"] == 4 * 1 + 8 * 2
    assert row["idle_gib_hours"] == 4 * 0.5
    assert row["idle_measured_sessions"] == 1
    assert row["never_fits"] == 1
    assert row["peak_cards"] == 1 and row["card_hours"] == 2
    row = figures(sessions[1:2], replay(sessions[1:2], Plan(cards=1)))
    assert row["idle_gib_hours"] is None


def test_a_spawn_that_finds_no_room_waits_until_a_slice_is_released() -> None:
    sessions = [
        Session(arrive=0, hold=100, gib=10),
        Session(arrive=10, hold=50, gib=10),
        Session(arrive=20, hold=50, gib=3),
    ]
    out = replay(sessions, Plan(cards=1))
    # The 3 GiB spawn goes first: waiting spawns that fit go, whatever came before them.
    assert out.waits == [0, 90, 0]
    row = figures(sessions, out)
    assert row_words(row) == "1 card: 33.33% of spawns wait, median 1 min, p95 1 min"
    assert row_words(figures(sessions, replay(sessions, Plan(cards=2)))) == "2 cards: no spawn waits"


def test_the_history_export_reads_back_as_sessions() -> None:
    held = [
        Held("ns/a@100", "ann", 5.0, 1_000_120.0, 1_003_720.0, "", "5gib", "Tesla-T4", 1_000_000.0),
        Held("ns/b@200", "bob", 3.0, 1_000_200.0, None, "", "3gib", "Tesla-T4", None),
    ]
    now = 1_000_800.0
    rows = history_rows(held, now)
    got = sessions_of(rows, lambda i: f"rows[{i}]", now)
    assert got[0] == Session(
        arrive=1_000_000.0, hold=3600.0, gib=5.0, model="Tesla-T4", user="ann", wait=120.0
    )
    assert got[1].hold == 600.0 and got[1].wait is None and got[1].arrive == 1_000_200.0
    # The CSV export too: its cells are text.
    import csv
    import io

    csv_rows = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert sessions_of(csv_rows, lambda i: f"row {i + 2}", now) == got
    summary = recorded(got)
    assert summary["spawns"] == 2 and summary["waited"] == 1 and summary["wait_p95_seconds"] == 120.0
    assert summary["peak_gib_held"] == 8.0


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({"gib": 5}, "rows[0], start: missing"),
        ({"start": "yesterday", "gib": 5}, "rows[0], start: 'yesterday' is not a time"),
        ({"start": "2026-11-01T08:00:00", "gib": 5}, "has no time zone"),
        ({"start": "2026-11-01T08:00:00Z", "end": "2026-11-01T07:00:00Z", "gib": 5}, "end: before start"),
        (
            {"start": "2026-11-01T08:00:00Z", "gib": "lots"},
            "gib: 'lots' is not a GiB amount above 0, at most 1024",
        ),
        ({"start": "2026-11-01T08:00:00Z", "gib": float("nan")}, "gib: 'nan' is not a GiB amount"),
        ({"start": "2026-11-01T08:00:00Z", "gib": True}, "gib: 'True' is not a GiB amount"),
        (
            {"start": "2026-11-01T08:00:00Z", "gib": 5, "idle_seconds": -1},
            "idle_seconds: '-1' is not a number of seconds, 0 or more",
        ),
        ({"start": 5, "gib": 5}, "start: 5 is not a time"),
        ([1, 2], "rows[0]: not an object"),
    ],
)
def test_a_bad_history_row_is_named_with_its_column(row: object, words: str) -> None:
    with pytest.raises(PlanningError, match=None) as err:
        session_of(row, "rows[0]", 0.0)  # type: ignore[arg-type]
    assert words in str(err.value)


def test_plans_and_ranges_refuse_what_they_cannot_replay() -> None:
    assert parse_cards_range("4..7") == [4, 5, 6, 7]
    assert parse_cards_range("8, 4") == [4, 8]
    assert parse_catalogue("7, 3,5") == (3, 5, 7)
    for spec, words in [
        ("12..4", "empty range"),
        ("four", "cannot read 'four'"),
        ("0..3", "0 is not from 1"),
    ]:
        with pytest.raises(PlanningError, match=words):
            parse_cards_range(spec)
    for spec, words in [
        ("3,,5", "cannot read ''"),
        ("3,3", "names a size twice"),
        ("-1", "cannot read '-1'"),
    ]:
        with pytest.raises(PlanningError, match=words):
            parse_catalogue(spec)
    with pytest.raises(PlanningError, match="16 GiB is not a slice of a Tesla-T4 card"):
        Plan(cards=4, catalogue=(4, 16))
    with pytest.raises(PlanningError, match="cards: 0 is not from 1"):
        Plan(cards=0)
    with pytest.raises(PlanningError, match="unknown policy 'tetris'"):
        replay([Session(0, 1, 1)], Plan(cards=1, policy="tetris"))
    with pytest.raises(PlanningError, match="no rows"):
        sessions_of([], str, 0.0)


def test_percentiles_are_values_that_occurred() -> None:
    assert percentile([], 95) is None
    assert percentile([5.0], 95) == 5.0
    assert percentile([float(x) for x in range(1, 101)], 95) == 95.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0


def test_nodes_of_several_cards_hold_the_same_sessions() -> None:
    sessions = synthetic(300, 21)
    one = figures(sessions, replay(sessions, Plan(cards=6, catalogue=(3, 5, 7))))
    two = figures(sessions, replay(sessions, Plan(cards=6, per_node=2, catalogue=(3, 5, 7))))
    three = figures(sessions, replay(sessions, Plan(cards=7, per_node=2, catalogue=(3, 5, 7))))
    assert two["cards"] == 6 and two["cards_per_node"] == 2
    assert three["cards"] == 7  # the last node has one card
    assert one["spawns"] == two["spawns"] == 300
    assert abs(one["waited"] - two["waited"]) <= 0.1 * max(one["waited"], 1)


def test_the_book_and_its_export_give_the_same_sessions() -> None:
    held = [
        Held("ns/a@1", "ann", 5.0, 1_000_120.0, 1_003_720.0, "", "5gib", "Tesla-T4", 1_000_000.0,
             idle_seconds=9_999.0),
        Held("ns/b@2", "bob", 3.0, 1_000_200.0, None, "", "3gib", "Tesla-T4", None),
    ]  # fmt: skip
    now = 1_000_800.0
    exported = sessions_of(history_rows(held, now, lambda user: ""), str, now)  # no names either
    assert sessions_from_held(held, now) == exported
    assert exported[0].idle == 3600.0  # idle time is at most the time held
