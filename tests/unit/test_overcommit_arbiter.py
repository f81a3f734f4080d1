"""The arbiter of an overcommitted card (core/arbiter.py): who is awake, who waits to wake and in
what order, who hibernates for them, and what a forged ask or an ungranted wake gets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_hub.core.arbiter import Decision, Measured, Situation, Slice, decide
from gpushare_hub.core.overcommit import (
    AWAKE,
    HIBERNATED,
    Ask,
    Book,
    Overcommit,
    book_annotation,
    read_book,
)

pytestmark = pytest.mark.unit
GIB = 1024
CARD = "GPU-0"
REAL = {CARD: 15 * GIB}
MIN_IDLE = 300


def slices(*names: str, card: str = CARD, gib: int = 5) -> dict[str, Slice]:
    return {n: Slice(f"jhub/{n}", {card: gib * GIB}) for n in names}


def quiet(at: float, used: int = 0) -> Measured:
    return Measured(used, 0, at)


def busy(at: float, used: int = 4 * GIB) -> Measured:
    return Measured(used, 50, at)


SLEEPING = Ask(hibernated=True, wake=False, idle_seconds=MIN_IDLE + 100)
WAKING = Ask(hibernated=True, wake=True, idle_seconds=0)


def idle_for(seconds: float) -> Ask:
    return Ask(hibernated=False, wake=False, idle_seconds=seconds)


def step(book: Book, now: float, pods: dict[str, Slice], asks=None, measured=None) -> Decision:
    s = Situation(REAL, pods, asks or {}, measured or {}, now, idle_memory_mib=GIB, min_idle=MIN_IDLE)
    return decide(book, s)


def states(d: Decision) -> dict[str, str]:
    return {u: r.state for u, r in d.book.pods.items()}


def three_awake() -> tuple[Book, dict[str, Slice]]:
    pods = slices("alice", "bob", "carol")
    return step(Book(), 0, pods).book, pods


def test_newcomers_are_awake_while_they_fit_and_hibernated_after():
    d = step(Book(), 0, slices("a", "b", "c", "d"))
    assert states(d) == {"a": AWAKE, "b": AWAKE, "c": AWAKE, "d": HIBERNATED}
    assert d.answers["a"].grant and d.answers["a"].state == AWAKE
    assert not d.answers["d"].grant and d.answers["d"].words == "hibernated; running a cell wakes it"


def test_a_pod_is_recorded_hibernated_once_it_says_so_and_the_plugin_measures_it():
    book, pods = three_awake()
    d = step(book, 10, pods, {"alice": SLEEPING}, {"alice": quiet(10.5)})
    assert states(d)["alice"] == HIBERNATED and d.book.pods["alice"].since == 10
    assert d.book.hibernated_mib() == {CARD: 5 * GIB}


def test_a_forged_hibernation_is_caught_by_the_measurement():
    book, pods = three_awake()
    d = step(book, 10, pods, {"alice": SLEEPING}, {"alice": quiet(10.5, used=4 * GIB)})
    assert states(d)["alice"] == AWAKE


def test_a_measurement_from_before_the_last_change_does_not_count():
    book, pods = three_awake()  # recorded at 0
    d = step(book, 10, pods, {"alice": SLEEPING}, {"alice": quiet(0)})
    assert states(d)["alice"] == AWAKE
    d = step(book, 10, pods, {"alice": Ask(True, True, 0)}, {"alice": quiet(5)})  # asks wake too
    assert states(d)["alice"] == AWAKE


def test_a_wake_that_fits_is_granted_at_once():
    book, pods = three_awake()
    book = step(book, 10, pods, {"alice": SLEEPING}, {"alice": quiet(11)}).book
    d = step(book, 20, pods, {"alice": WAKING}, {"alice": quiet(11)})
    assert states(d)["alice"] == AWAKE and d.answers["alice"].grant
    assert d.book.line == {}


def dave_lands_while_alice_sleeps() -> tuple[Book, dict[str, Slice]]:
    book, pods = three_awake()
    book = step(book, 10, pods, {"alice": SLEEPING}, {"alice": quiet(11)}).book
    pods = {**pods, **slices("dave")}
    book = step(book, 20, pods, {"alice": SLEEPING}).book
    assert states_of(book) == {"alice": HIBERNATED, "bob": AWAKE, "carol": AWAKE, "dave": AWAKE}
    return book, pods


def states_of(book: Book) -> dict[str, str]:
    return {u: r.state for u, r in book.pods.items()}


def test_a_wake_that_does_not_fit_waits_and_says_that_no_neighbour_is_idle_long_enough():
    book, pods = dave_lands_while_alice_sleeps()
    asks = {"alice": WAKING, "bob": idle_for(MIN_IDLE - 1), "carol": idle_for(10), "dave": idle_for(0)}
    d = step(book, 30, pods, asks, {"bob": quiet(29), "carol": quiet(29), "dave": busy(29)})
    a = d.answers["alice"]
    assert (a.state, a.grant, a.place, a.ahead) == (HIBERNATED, False, 1, 0)
    assert a.words == "waiting for 5 GiB on your card: 0 ahead; no neighbour has been idle 5 min yet"
    assert not any(x.hibernate_now for x in d.answers.values())
    assert d.book.line == {CARD: ("alice",)}


def test_the_longest_idle_neighbour_past_the_minimum_is_asked_to_hibernate():
    book, pods = dave_lands_while_alice_sleeps()  # bob, carol, dave quiet since 20 by the plugin's clock
    now = 20 + MIN_IDLE
    asks = {"alice": WAKING, "bob": idle_for(400), "carol": idle_for(900), "dave": idle_for(MIN_IDLE)}
    m = {u: quiet(now - 1, used=3 * GIB) for u in ("bob", "carol", "dave")}
    d = step(book, now, pods, asks, m)
    assert [u for u, a in d.answers.items() if a.hibernate_now] == ["carol"]
    assert d.answers["alice"].words.endswith("neighbours idle 5 min are hibernated first")
    # carol hibernates: alice is granted at once, in the same round
    asks["carol"] = SLEEPING
    d = step(d.book, now + 2, pods, asks, {**m, "carol": quiet(now + 1)})
    assert states(d) == {"alice": AWAKE, "bob": AWAKE, "carol": HIBERNATED, "dave": AWAKE}
    assert d.answers["alice"].grant and not any(a.hibernate_now for a in d.answers.values())


def test_a_neighbour_busy_in_the_last_minutes_is_never_hibernated_for_another():
    book, pods = dave_lands_while_alice_sleeps()
    now = 20 + MIN_IDLE
    asks = {"alice": WAKING, "bob": idle_for(900), "carol": idle_for(900), "dave": idle_for(900)}
    # They say they are idle, but the plugin measured GPU work a minute ago.
    book = step(book, now - 60, pods, asks, {u: busy(now - 61) for u in ("bob", "carol", "dave")}).book
    d = step(book, now, pods, asks, {u: quiet(now - 1) for u in ("bob", "carol", "dave")})
    assert not any(a.hibernate_now for a in d.answers.values())
    d = step(d.book, now + MIN_IDLE - 60, pods, asks, {u: quiet(now) for u in ("bob", "carol", "dave")})
    assert not any(a.hibernate_now for a in d.answers.values())
    d = step(d.book, now + MIN_IDLE, pods, asks, {u: quiet(now) for u in ("bob", "carol", "dave")})
    assert sum(a.hibernate_now for a in d.answers.values()) == 1


def test_wakes_are_granted_in_the_order_asked():
    pods = slices("a", "b", "c", "d", "e", gib=5)
    book = step(Book(), 0, pods).book  # a, b, c awake; d, e hibernated
    book = step(book, 10, pods, {"e": WAKING, "d": SLEEPING}).book
    d = step(book, 20, pods, {"e": WAKING, "d": WAKING})
    assert d.book.line == {CARD: ("e", "d")}
    assert (d.answers["d"].place, d.answers["d"].ahead) == (2, 1)
    assert d.answers["d"].words.startswith("waiting for 5 GiB on your card: 1 ahead")
    # a hibernates: e, not d, wakes
    d = step(d.book, 30, pods, {"e": WAKING, "d": WAKING, "a": SLEEPING}, {"a": quiet(31)})
    d = step(d.book, 40, pods, {"e": WAKING, "d": WAKING, "a": SLEEPING}, {"a": quiet(41)})
    assert states(d)["e"] == AWAKE and states(d)["d"] == HIBERNATED and d.book.line == {CARD: ("d",)}


def test_a_wake_storm_keeps_the_awake_sum_within_the_card_and_serves_in_order():
    pods = slices(*"abcdefgh", gib=3)  # 8 x 3 GiB on 15 GiB: 5 awake
    book = step(Book(), 0, pods).book
    asleep = [u for u, r in book.pods.items() if r.state == HIBERNATED]
    assert asleep == ["f", "g", "h"]
    asks = {u: WAKING for u in asleep}
    for t, u in enumerate("abcde", start=1):  # the awake ones hibernate one by one
        asks[u] = SLEEPING
        book = step(book, 10 * t, pods, asks, {u: quiet(10 * t - 5) for u in "abcde"}).book
        awake = sum(r.mib for r in book.pods.values() if r.state == AWAKE)
        assert awake <= 15 * GIB
    assert [u for u in "fgh" if book.pods[u].state == AWAKE] == ["f", "g", "h"]


def test_an_ungranted_wake_that_fits_is_recorded_awake_and_one_that_does_not_is_over_its_slice():
    book, pods = three_awake()
    book = step(book, 10, pods, {"alice": SLEEPING}, {"alice": quiet(11)}).book
    d = step(book, 20, pods, {"alice": SLEEPING}, {"alice": busy(19)})  # woke without asking
    assert states(d)["alice"] == AWAKE and [(u.uid, u.fits) for u in d.unasked] == [("alice", True)]
    assert "it woke without the device plugin's grant" in d.unasked[0].message("nb-1")
    assert not d.over
    # now with dave in alice's room
    book, pods = dave_lands_while_alice_sleeps()
    d = step(book, 30, pods, {"alice": SLEEPING}, {"alice": busy(29)})
    assert states(d)["alice"] == HIBERNATED and d.over == {"alice"}
    assert [(u.uid, u.fits) for u in d.unasked] == [("alice", False)]
    assert "reported over its slice (0 allowed)" in d.unasked[0].message("nb-1")
    assert d.answers["alice"].words.startswith("using the GPU without a grant")
    # it stops: no longer over
    d = step(d.book, 40, pods, {"alice": SLEEPING}, {"alice": quiet(39)})
    assert not d.over and not d.unasked


def test_pods_gone_are_forgotten_and_leave_their_line():
    book, pods = dave_lands_while_alice_sleeps()
    book = step(book, 30, pods, {"alice": WAKING}).book
    assert book.line == {CARD: ("alice",)}
    del pods["alice"]
    d = step(book, 40, pods)
    assert "alice" not in d.book.pods and d.book.line == {}
    assert set(d.answers) == {"bob", "carol", "dave"}


def test_a_pod_over_several_cards_counts_awake_and_never_hibernates():
    pods = {**slices("a"), "big": Slice("jhub/big", {CARD: 12 * GIB, "GPU-1": 12 * GIB})}
    d = step(Book(), 0, pods)
    assert states(d) == {"a": HIBERNATED} and "big" not in d.answers
    assert d.card_sums(REAL, pods)[CARD].awake_mib == 12 * GIB


def test_a_restarted_plugin_goes_on_from_the_book_on_its_node():
    book, pods = dave_lands_while_alice_sleeps()
    d = step(book, 30, pods, {"alice": WAKING})
    raw = book_annotation(d.book, Overcommit(2.0, 65536, MIN_IDLE), d.card_sums(REAL, pods))
    again = read_book(raw)
    assert states_of(again) == states(d) and again.line == d.book.line
    # the restarted plugin decides the same
    d2 = step(again, 31, pods, {"alice": WAKING})
    assert states(d2) == states(d) and d2.book.line == d.book.line


asks_st = st.sampled_from(
    [None, SLEEPING, WAKING, idle_for(0), idle_for(MIN_IDLE * 2), Ask(False, True, 0), Ask(True, False, 0)]
)
measured_st = st.one_of(
    st.none(),
    st.builds(
        Measured, st.sampled_from([0, 512, 2 * GIB, 6 * GIB]), st.sampled_from([None, 0, 30]), st.just(0)
    ),
)
names = [f"p{i}" for i in range(7)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sets(st.sampled_from(names), min_size=1),  # pods present this round
            st.dictionaries(st.sampled_from(names), asks_st),
            st.dictionaries(st.sampled_from(names), measured_st),
            st.integers(1, 400),  # seconds since the round before
            st.booleans(),  # restart: the book goes through the annotation
        ),
        max_size=25,
    ),
)
def test_whatever_the_asks_and_measurements_the_awake_slices_fit_the_card(rounds):
    sizes = {n: (i % 3 + 2) * GIB for i, n in enumerate(names)}
    cards = {n: CARD if i % 4 else "GPU-1" for i, n in enumerate(names)}
    real = {CARD: 15 * GIB, "GPU-1": 8 * GIB}
    book, now = Book(), 0.0
    for present, asks, measured, dt, restart in rounds:
        now += dt
        pods = {n: Slice(f"jhub/{n}", {cards[n]: sizes[n]}) for n in present}
        m = {u: Measured(x.used_mib, x.sm_util, now - 0.5) for u, x in measured.items() if x is not None}
        a = {u: x for u, x in asks.items() if x is not None}
        d = decide(book, Situation(real, pods, a, m, now, GIB, MIN_IDLE))
        for card, mib in real.items():
            awake = sum(r.mib for r in d.book.pods.values() if r.card == card and r.state == AWAKE)
            assert awake <= mib
        for u in d.over:  # caught: recorded hibernated, measured using memory, reported over
            assert d.book.pods[u].state == HIBERNATED and m[u].used_mib > GIB
        assert set(d.book.pods) == set(present) == set(d.answers)
        for card, q in d.book.line.items():
            assert len(set(q)) == len(q) and all(d.book.pods[u].state == HIBERNATED for u in q)
            assert all(d.book.pods[u].card == card for u in q)
        for u, ans in d.answers.items():
            assert ans.grant == (d.book.pods[u].state == AWAKE)
            assert not (ans.hibernate_now and ans.state != AWAKE)
        book = read_book(book_annotation(d.book, Overcommit(2.0, 1 << 20), {})) if restart else d.book


def test_a_pod_without_a_door_is_always_awake():
    """Served before the node was overcommitted, or a whole card: it cannot ask to wake."""
    pods = {**slices("a", "b"), "old": Slice("jhub/old", {CARD: 10 * GIB}, door=False)}
    d = step(Book(), 0, pods, {"old": SLEEPING}, {"old": quiet(5)})
    assert states(d) == {"a": AWAKE, "b": HIBERNATED} and "old" not in d.answers
    assert d.card_sums(REAL, pods)[CARD].awake_mib == 15 * GIB
