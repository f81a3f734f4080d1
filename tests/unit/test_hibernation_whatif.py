"""The what-if with hibernation (core/hibernation_whatif.py, driven by core/planning.replay):
idle notebooks hibernate after N minutes, cards hold F x their memory, the awake slices fit the
card. Hand-made histories where it provably saves a card and where it cannot; the rules of the
model checked card by card against a book kept by hand, on random operations."""

from __future__ import annotations

import math
import random

import pytest

from gpushare_hub.core.hibernation_whatif import Cards, Hibernation, HibernationError
from gpushare_hub.core.planning import Plan, Session, figures, replay
from gpushare_hub.core.policy import Placer

pytestmark = pytest.mark.unit
HOUR = 3600.0
T4 = Plan(cards=4)  # 15 GiB cards


def two_idle_two_busy(idle: float | None) -> list[Session]:
    """Four 5 GiB sessions on 15 GiB cards: two from 0 for 4 h, idle ``idle`` seconds of it,
    and two more that come at 1 h for 2 h and never idle."""
    return [
        Session(arrive=0, hold=4 * HOUR, gib=5, idle=idle),
        Session(arrive=1, hold=4 * HOUR, gib=5, idle=idle),
        Session(arrive=HOUR, hold=2 * HOUR, gib=5, idle=0),
        Session(arrive=HOUR + 1, hold=2 * HOUR, gib=5, idle=0),
    ]


def test_the_model_takes_the_idle_time_as_the_end_of_the_session() -> None:
    hib = Hibernation(after=20 * 60)
    assert hib.awake_for(HOUR, 50 * 60) == HOUR - 50 * 60 + 20 * 60
    assert hib.awake_for(HOUR, 20 * 60) == HOUR  # not idle longer than N: awake throughout
    assert hib.awake_for(HOUR, None) == HOUR  # not measured: taken as never idle
    assert hib.awake_for(HOUR, 5 * HOUR) == 20 * 60  # idle is at most the hold
    assert hib.awake_for(10 * 60, 10 * 60) == 10 * 60  # shorter than N: never hibernates
    assert [Hibernation(60, f).held_gib(15) for f in (1, 1.5, 2, 4)] == [15, 22, 30, 60]


def test_two_sessions_idle_most_of_their_hold_save_a_card() -> None:
    sessions = two_idle_two_busy(idle=3.5 * HOUR)  # awake 50 min, hibernated from then
    plain = replay(sessions, T4)
    hib = replay(sessions, T4, Hibernation(after=20 * 60, factor=2))
    assert (plain.peak_cards, plain.peak_lower_bound) == (2, 2)  # 20 GiB at once on 15 GiB cards
    # At 1 h the first two are hibernated: 10 GiB awake, 20 GiB held, on one card of 15 (x2).
    assert (hib.peak_cards, hib.peak_lower_bound) == (1, 1)
    assert hib.card_hours < plain.card_hours
    assert all(w == 0 for w in hib.waits)


def test_without_overcommit_hibernation_frees_no_card() -> None:
    sessions = two_idle_two_busy(idle=3.5 * HOUR)
    hib = replay(sessions, T4, Hibernation(after=20 * 60, factor=1))
    assert (hib.peak_cards, hib.peak_lower_bound) == (2, 2)  # held GiB still within one card


def test_the_held_rule_binds_too_a_card_holds_at_most_f_times_its_memory() -> None:
    # Six 5 GiB sessions, each hibernated (after 1 h 1 min) before the next comes, then a
    # seventh: 5 GiB awake, but 35 held > 2 x 15.
    sessions = [Session(arrive=i * 1.1 * HOUR, hold=20 * HOUR, gib=5, idle=19 * HOUR) for i in range(6)]
    sessions.append(Session(arrive=8 * HOUR, hold=HOUR, gib=5))
    hib = replay(sessions, T4, Hibernation(after=60, factor=2))
    assert hib.peak_cards == 2 and hib.peak_lower_bound == 2
    assert replay(sessions, T4, Hibernation(after=60, factor=3)).peak_cards == 1


@pytest.mark.parametrize("idle", [0.0, None, 20 * 60.0])
def test_sessions_never_idle_longer_than_n_replay_as_without_hibernation(idle: float | None) -> None:
    sessions = two_idle_two_busy(idle=idle)
    plain = replay(sessions, T4)
    hib = replay(sessions, T4, Hibernation(after=20 * 60, factor=2))
    assert (hib.peak_cards, hib.peak_lower_bound) == (plain.peak_cards, plain.peak_lower_bound) == (2, 2)
    assert hib.card_hours == plain.card_hours and hib.waits == plain.waits


def synthetic(n: int, seed: int) -> list[Session]:
    rng = random.Random(seed)
    sessions = [
        Session(
            arrive=float(rng.randrange(30_000)),
            hold=float(rng.randrange(60, 3 * 3600)),
            gib=rng.choice((1, 3, 5, 5, 7, 8, 15)),
            idle=rng.choice((None, 0.0, float(rng.randrange(0, 3 * 3600)))),
        )
        for _ in range(n)
    ]
    return sorted(sessions, key=lambda s: s.arrive)


@pytest.mark.parametrize(("seed", "factor"), [(1, 2.0), (2, 1.5), (3, 4.0), (4, 1.0)])
def test_with_room_for_all_the_bound_is_never_above_the_cards_nor_the_bound_without(
    seed: int, factor: float
) -> None:
    sessions = synthetic(300, seed)
    plan = Plan(cards=200, catalogue=(3, 5, 7))
    plain = replay(sessions, plan)
    hib = replay(sessions, plan, Hibernation(after=15 * 60, factor=factor))
    assert hib.waits == plain.waits  # room for everyone: the same moments
    assert all(b <= c for b, c in zip(hib.bounds, hib.cards, strict=True))
    # Awake sizes are among the held ones and the held ones fit in a larger card (the replay
    # with hibernation also steps at each hibernation: compare at the plain one's moments).
    at = dict(zip(hib.times, hib.bounds, strict=True))
    assert set(plain.times) <= set(at)
    assert all(at[t] <= b for t, b in zip(plain.times, plain.bounds, strict=True))
    if factor == 1.0:
        assert hib.peak_lower_bound == plain.peak_lower_bound
    assert hib.peak_lower_bound <= plain.peak_lower_bound


@pytest.mark.parametrize(("seed", "factor"), [(5, 2.0), (6, 1.5), (7, 1.0), (8, 3.0)])
def test_every_card_keeps_both_rules_and_a_refused_slice_fits_no_card(seed: int, factor: float) -> None:
    """Random placements, hibernations and releases, checked against a book kept by hand."""
    rng = random.Random(seed)
    plan = Plan(cards=6, per_node=2)
    held_gib = Hibernation(60, factor).held_gib(plan.card_gib)
    cards = Cards(plan.ledger(held_gib), plan.card_gib, held_gib)
    placer = Placer(cards.ledger, "binpack")
    book: dict[str, tuple[str, int, bool]] = {}  # key -> (card, GiB, hibernated)
    for step in range(3000):
        move = rng.random()
        awake = [k for k, v in book.items() if not v[2]]
        if move < 0.5 or not book:
            key, size = f"s{step}", rng.choice((1, 2, 3, 5, 7, 10, 15))
            placement = placer.place_if_room(cards.demand(key, size))
            rooms = [
                (
                    plan.card_gib - sum(g for c, g, a in book.values() if c == uuid and not a),
                    held_gib - sum(g for c, g, _ in book.values() if c == uuid),
                )
                for uuid in {c.uuid for n in cards.ledger.nodes() for c in n.cards}
            ]
            if placement is None:
                assert not any(a >= size and h >= size for a, h in rooms), step
                continue
            cards.placed(placement, size)
            book[key] = (placement.cards[0].uuid, size, False)
        elif move < 0.75 and awake:
            key = rng.choice(awake)
            cards.hibernate(key)
            book[key] = (book[key][0], book[key][1], True)
        else:
            key = rng.choice(sorted(book))
            cards.release(key)
            del book[key]
        for uuid in {c for c, _, _ in book.values()}:
            assert sum(g for c, g, a in book.values() if c == uuid and not a) <= plan.card_gib
            assert sum(g for c, g, _ in book.values() if c == uuid) <= held_gib
        assert cards.in_use() == len({c for c, _, _ in book.values()})


def test_the_figures_of_a_replay_with_hibernation_are_the_plain_ones_keys() -> None:
    sessions = two_idle_two_busy(idle=3.5 * HOUR)
    row = figures(sessions, replay(sessions, T4, Hibernation(after=20 * 60)))
    assert (row["peak_cards"], row["peak_lower_bound"], row["waited"]) == (1, 1, 0)


@pytest.mark.parametrize(
    ("after", "factor", "words"),
    [
        (0, 2, "hibernate after: 0 seconds is not above 0"),
        (-60, 2, "is not above 0"),
        (math.nan, 2, "is not above 0"),
        (60, 0.5, "overcommit: 0.5 is not from 1 to 4"),
        (60, 4.5, "overcommit: 4.5 is not from 1 to 4"),
        (60, math.inf, "overcommit: inf is not from 1 to 4"),
    ],
)
def test_a_hibernation_that_cannot_be_is_refused_naming_the_value_and_the_fix(
    after: float, factor: float, words: str
) -> None:
    with pytest.raises(HibernationError, match=r"e\.g\.") as err:
        Hibernation(after=after, factor=factor)
    assert words in str(err.value)
