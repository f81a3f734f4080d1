"""GiB-hour budgets: the windows, the counting, and the book across restarts (core/budget.py,
accounting/store.py)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from gpushare_hub.accounting.book import Book
from gpushare_hub.core.budget import (
    Budget,
    Held,
    Overrun,
    gib_hours,
    limit_for,
    refusal,
    reset_words,
    spend_line,
    window_bounds,
)

pytestmark = pytest.mark.unit
BERLIN = ZoneInfo("Europe/Berlin")
H = 3600.0


def ts(text: str, tz=UTC) -> float:  # type: ignore[no-untyped-def]
    return datetime.fromisoformat(text).replace(tzinfo=tz).timestamp()


# ---- windows -------------------------------------------------------------------------------
def test_a_day_runs_midnight_to_midnight() -> None:
    assert window_bounds(ts("2026-11-26T13:05:00"), "day", UTC) == (
        ts("2026-11-26T00:00:00"),
        ts("2026-11-27T00:00:00"),
    )


def test_a_week_runs_from_monday_and_a_sunday_night_is_still_that_week() -> None:
    week = (ts("2026-11-23T00:00:00"), ts("2026-11-30T00:00:00"))
    assert window_bounds(ts("2026-11-26T13:05:00"), "week", UTC) == week
    assert window_bounds(ts("2026-11-29T23:59:59"), "week", UTC) == week
    assert window_bounds(ts("2026-11-30T00:00:00"), "week", UTC)[0] == week[1]  # the edge opens the next


def test_a_month_runs_from_the_first_and_december_ends_in_january() -> None:
    assert window_bounds(ts("2026-12-31T23:00:00"), "month", UTC) == (
        ts("2026-12-01T00:00:00"),
        ts("2027-01-01T00:00:00"),
    )
    assert window_bounds(ts("2027-02-10T00:00:00"), "month", UTC) == (
        ts("2027-02-01T00:00:00"),
        ts("2027-03-01T00:00:00"),
    )


def test_windows_follow_the_zone_across_a_daylight_saving_change() -> None:
    # Berlin moves its clocks forward on 29 March 2026: that day has 23 hours, and midnight stays midnight.
    start, end = window_bounds(ts("2026-03-29T12:00:00", BERLIN), "day", BERLIN)
    assert (start, end) == (ts("2026-03-29T00:00:00", BERLIN), ts("2026-03-30T00:00:00", BERLIN))
    assert end - start == 23 * H
    start, end = window_bounds(ts("2026-10-25T12:00:00", BERLIN), "day", BERLIN)  # back: 25 hours
    assert end - start == 25 * H
    # A Berlin day is not a UTC day: 00:30 local on the 27th is still the 26th in UTC.
    assert window_bounds(ts("2026-11-27T00:30:00", BERLIN), "day", BERLIN)[0] == ts(
        "2026-11-27T00:00:00", BERLIN
    )


def test_an_unknown_window_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"unknown budget window 'year'.*day, week, month"):
        window_bounds(0, "year", UTC)


# ---- counting ------------------------------------------------------------------------------
def test_a_slice_spanning_two_windows_costs_each_its_own_part() -> None:
    # 5 GiB from Sunday 20:00 to Monday 04:00: 4 h in each week.
    held = [Held("p", "alice", 5, ts("2026-11-29T20:00:00"), ts("2026-11-30T04:00:00"))]
    first = window_bounds(ts("2026-11-29T20:00:00"), "week", UTC)
    second = window_bounds(ts("2026-11-30T04:00:00"), "week", UTC)
    now = ts("2026-12-01T00:00:00")
    assert gib_hours(held, *first, now) == pytest.approx(20)
    assert gib_hours(held, *second, now) == pytest.approx(20)


def test_a_slice_still_held_counts_up_to_now_and_never_before_its_start() -> None:
    held = [Held("p", "alice", 7, ts("2026-11-26T10:00:00"))]
    day = window_bounds(ts("2026-11-26T10:00:00"), "day", UTC)
    assert gib_hours(held, *day, ts("2026-11-26T12:30:00")) == pytest.approx(17.5)
    assert gib_hours(held, *day, ts("2026-11-26T09:00:00")) == 0  # a clock behind the start counts nothing


def test_the_largest_group_budget_wins_over_the_users_own() -> None:
    assert limit_for(100, {"gpu-power": 400, "course": 50}, ["course", "gpu-power"]) == 400
    assert limit_for(100, {"gpu-power": 400}, ["other"]) == 100
    assert limit_for(None, {}, ["x"]) is None
    assert limit_for(None, {"course": 0}, ["course"]) == 0


def test_the_form_line_and_the_refusal_say_the_numbers_and_the_reset() -> None:
    week = window_bounds(ts("2026-11-26T12:00:00"), "week", UTC)
    budget = Budget("week", *week, limit=100, used=38)
    assert spend_line(budget, "a 5 GiB slice", 5, 8) == (
        "38 of 100 GiB·h used this week; a 5 GiB slice for 8 h would use 40"
    )
    assert not budget.spent and budget.hours_left(5) == pytest.approx(12.4)
    assert spend_line(budget, "a 5 GiB slice", 5, 16) == (
        "38 of 100 GiB·h used this week; a 5 GiB slice for 16 h would use 80 (62 left: about 12 h of it)"
    )
    nearly = Budget("week", *week, limit=1, used=0.1)
    assert spend_line(nearly, "a 5 GiB slice", 5, 8).endswith("would use 40 (0.9 left: about 11 min of it)")
    spent = Budget("week", *week, limit=100, used=100.2, added=0)
    assert spent.spent
    text = refusal(spent, UTC)
    assert "100 of 100 GiB·h used this week" in text and "resets Monday 30 November 00:00 UTC" in text
    topped = Budget("week", *week, limit=100, used=100.2, added=20)
    assert not topped.spent and topped.used_words() == "100 of 120 GiB·h (with 20 added) used this week"
    assert reset_words(week[1], BERLIN) == "Monday 30 November 01:00 CET"


def test_a_spent_budget_is_warned_then_due_after_the_grace() -> None:
    budget = Budget("day", 0, 86400, limit=10, used=11)
    assert Overrun("alice", budget, None, 900).phase(1000) == "warn"
    assert Overrun("alice", budget, 1000, 900).phase(1899) == "warned"
    assert Overrun("alice", budget, 1000, 900).phase(1900) == "due"


# ---- the book across restarts ------------------------------------------------------------------
def test_the_book_counts_from_placement_to_the_pass_that_no_longer_sees_the_pod(tmp_path: Path) -> None:
    book = Book(tmp_path / "state.sqlite")
    t0 = ts("2026-11-26T10:00:00")
    pod = Held("ns/jupyter-alice@t0", "alice", 5, t0, server="")
    book.observe([pod], now=t0 + 60, gap=90)
    book.observe([pod], now=t0 + 3600, gap=90)
    assert book.used("alice", *window_bounds(t0, "day", UTC), now=t0 + 7200) == pytest.approx(
        10
    )  # open: to now
    (closed,) = book.observe([], now=t0 + 3630, gap=90)
    assert closed.end == t0 + 3630
    assert book.used("alice", *window_bounds(t0, "day", UTC), now=t0 + 7200) == pytest.approx(5 * 3630 / H)


def test_a_restart_loses_at_most_the_time_the_service_was_down(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    t0 = ts("2026-11-26T10:00:00")
    gone, stays = Held("a", "alice", 5, t0), Held("b", "bob", 3, t0)
    book = Book(path)
    book.observe([gone, stays], now=t0 + 3600, gap=90)
    book.close()
    # Down for two hours; alice's pod went meanwhile, bob's is still there.
    book = Book(path)
    book.observe([stays], now=t0 + 3 * 3600, gap=90)
    day = window_bounds(t0, "day", UTC)
    assert book.used("alice", *day, now=t0 + 4 * 3600) == pytest.approx(5)  # ended when last seen
    assert book.used("bob", *day, now=t0 + 4 * 3600) == pytest.approx(12)  # counted through the gap
    assert book.used_by_user(*day, now=t0 + 4 * 3600) == pytest.approx({"alice": 5, "bob": 12})


def test_a_placement_a_pass_missed_is_counted_all_along_and_a_new_one_of_the_same_pod_apart(
    tmp_path: Path,
) -> None:
    book = Book(tmp_path / "state.sqlite")
    pod = Held("hub/jupyter-alice@0", "alice", 5, 0)
    book.observe([pod], now=100, gap=90)
    book.observe([], now=150, gap=90)  # a relist that missed it
    book.observe([pod], now=200, gap=90)  # the key names one placement: it was held all along
    assert book.used("alice", 0, 86400, now=1000) == pytest.approx(5 * 1000 / H)
    # Stopped, then started again under the same pod name: a new placement, the gap not counted.
    book.observe([pod], now=990, gap=90)
    book.observe([], now=1000, gap=90)
    book.observe([Held("hub/jupyter-alice@2000", "alice", 5, 2000)], now=2010, gap=90)
    assert book.used("alice", 0, 86400, now=3000) == pytest.approx(5 * 2000 / H)


def test_a_pod_whose_start_is_read_later_stays_one_placement(tmp_path: Path) -> None:
    book = Book(tmp_path / "state.sqlite")
    book.observe([Held("hub/p@100", "alice", 5, 100)], now=120, gap=90)  # its creation, at first
    book.observe([Held("hub/p@110", "alice", 5, 110)], now=150, gap=90)  # then its start time
    assert [(h.key, h.start, h.end) for h in book.intervals(0, 86400)] == [("hub/p@100", 100, None)]
    assert book.used("alice", 0, 86400, now=3700) == pytest.approx(5 * 3600 / H)


def test_what_an_admin_adds_belongs_to_one_window_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    book = Book(path)
    assert book.add("alice", 1000.0, 20, by="admin", now=1100) == 20
    assert book.add("alice", 1000.0, 5, by="admin", now=1200) == 25
    book.close()
    book = Book(path)
    assert book.added("alice", 1000.0) == 25
    assert book.added("alice", 2000.0) == 0
    assert book.added_by_user(1000.0) == {"alice": 25}


def test_an_action_is_recorded_once_per_user_and_window(tmp_path: Path) -> None:
    book = Book(tmp_path / "state.sqlite")
    assert book.record_budget("alice", 0, "warned", 10)
    assert not book.record_budget("alice", 0, "warned", 20)
    assert book.budget_done("alice", 0) == {"warned": 10}
    assert book.budget_done("alice", 86400) == {}
    book.forget_budget("warned", "alice", 0)
    assert book.budget_done("alice", 0) == {}


# ---- the service's keeper: the book each pass, the warning, the action ----------------------------
class FakeHub:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.up = {("alice", "")}

    async def stop(self, user, server):  # type: ignore[no-untyped-def]
        self.calls.append(("stop", user, server))
        self.up.discard((user, server))
        return 204, None

    async def start(self, user, server, options):  # type: ignore[no-untyped-def]
        self.calls.append(("start", user, server, dict(options)))
        return 202, None

    async def running(self, user, server):  # type: ignore[no-untyped-def]
        return (user, server) in self.up


def alloc(user: str, pod: str, units: int, since: str, server: str = ""):  # type: ignore[no-untyped-def]
    from gpushare_hub.service.held import HeldSlice
    from gpushare_hub.service.hubservers import seconds_of

    return HeldSlice(namespace="hub", pod=pod, user=user, server=server, units=units, since=seconds_of(since))


def keeper(tmp_path: Path, clock: list[float], action: str = "stop", per_user: float | None = 10):  # type: ignore[no-untyped-def]
    """The service's pass (the book, the budget policy, the enforcer) with a budget rule."""
    from gpushare_hub.service.budgets import BudgetRule
    from gpushare_hub.service.enforcement import Enforcement
    from gpushare_hub.service.idle import IdleRule

    events: list[tuple] = []

    async def post(ns, pod, reason, message):  # type: ignore[no-untyped-def]
        events.append((ns, pod, reason, message))

    rule = BudgetRule(per_user=per_user, window="day", tz=UTC, grace=600, action=action, park_profile="cpu")
    hub = FakeHub()
    book = Book(tmp_path / "state.sqlite")
    e = Enforcement(book, IdleRule(), rule, hub, post, check_seconds=30, clock=lambda: clock[0])  # type: ignore[arg-type]
    return e, hub, events


async def tick(e, mine: list, groups: dict) -> list[str]:  # type: ignore[no-untyped-def]
    """One pass; the users acted on."""
    return [c.user for c in await e.run_pass(mine, groups)]


def test_the_keeper_books_each_pod_once_summing_its_cards(tmp_path: Path) -> None:
    from gpushare_hub.service.held import held_now

    since = "2026-11-26T10:00:00Z"
    held = held_now(
        [alloc("alice", "p", 5, since), alloc("alice", "p", 5, since), alloc("", "x", 3, since)], 0
    )
    assert [(h.user, h.gib, h.start) for h in held] == [("alice", 10.0, ts("2026-11-26T10:00:00"))]


async def test_a_spent_budget_is_warned_on_the_pod_then_the_server_is_stopped_after_the_grace(
    tmp_path: Path,
) -> None:

    t0 = ts("2026-11-26T10:00:00")
    clock = [t0 + 60]
    k, hub, events = keeper(tmp_path, clock)
    mine = [alloc("alice", "jupyter-alice", 5, "2026-11-26T10:00:00Z")]
    assert await tick(k, mine, {"alice": []}) == []  # 5 GiB for a minute: far from 10 GiB·h
    clock[0] = t0 + 2 * H + 30  # 10.04 GiB·h
    assert await tick(k, mine, {"alice": []}) == ["alice"]
    (event,) = events
    assert event[2] == "GPUShareBudgetSpent" and "10 of 10 GiB·h used today" in event[3]
    assert "stopped at 12:10 UTC unless an admin adds GiB·h" in event[3]
    doc = k.budgets.document("alice", [])
    assert doc is not None and doc["spent"] and doc["overrun"]["due_at"] == "2026-11-26T12:10:30+00:00"
    clock[0] += 300  # within the grace: nothing more
    assert await tick(k, mine, {"alice": []}) == [] and hub.calls == []
    clock[0] += 300
    assert await tick(k, mine, {"alice": []}) == ["alice"]
    await k.enforcer.settled()
    assert hub.calls == [("stop", "alice", "")]
    assert [e[2] for e in events] == ["GPUShareBudgetSpent", "GPUShareBudgetReturned"]
    clock[0] += 30  # the pod is still going: no second warning for it
    assert await tick(k, mine, {"alice": []}) == [] and len(events) == 2


async def test_an_admins_addition_within_the_grace_withdraws_the_warning(tmp_path: Path) -> None:
    t0 = ts("2026-11-26T10:00:00")
    clock = [t0 + 2 * H + 30]
    k, hub, _events = keeper(tmp_path, clock)
    mine = [alloc("alice", "jupyter-alice", 5, "2026-11-26T10:00:00Z")]
    await tick(k, mine, {"alice": []})
    assert k.book.budget_done("alice", k.budgets.window(clock[0])[0]).get("warned") is not None
    k.book.add("alice", k.budgets.window(clock[0])[0], 20, by="admin")
    clock[0] += 900
    assert await tick(k, mine, {"alice": []}) == [] and hub.calls == []
    assert k.book.budget_done("alice", k.budgets.window(clock[0])[0]) == {}
    doc = k.budgets.document("alice", [])
    assert doc is not None and not doc["spent"] and "overrun" not in doc and doc["added_gib_hours"] == 20


async def test_park_restarts_the_server_on_the_cpu_profile_and_notify_only_warns(tmp_path: Path) -> None:

    t0 = ts("2026-11-26T10:00:00")
    mine = [alloc("alice", "jupyter-alice", 5, "2026-11-26T10:00:00Z")]
    clock = [t0 + 2 * H + 30]
    k, hub, _ = keeper(tmp_path / "park", clock, action="park")
    await tick(k, mine, {"alice": []})
    clock[0] += 600
    await tick(k, mine, {"alice": []})
    await k.enforcer.settled()
    assert hub.calls == [("stop", "alice", ""), ("start", "alice", "", {"profile": "cpu"})]
    k, hub, events = keeper(tmp_path / "notify", clock, action="notify")
    await tick(k, mine, {"alice": []})
    clock[0] += 3600
    await tick(k, mine, {"alice": []})
    assert hub.calls == [] and len(events) == 1 and "unless" not in events[0][3]


async def test_a_user_without_a_budget_is_booked_but_never_warned(tmp_path: Path) -> None:
    t0 = ts("2026-11-26T10:00:00")
    clock = [t0 + 10 * H]
    k, _hub, events = keeper(tmp_path, clock, per_user=None)
    assert await tick(k, [alloc("bob", "jupyter-bob", 7, "2026-11-26T10:00:00Z")], {"bob": []}) == []
    assert events == [] and k.budgets.document("bob", []) is None
    assert k.book.used("bob", *k.budgets.window(clock[0]), now=clock[0]) == pytest.approx(70)


def test_the_admins_view_lists_users_with_a_budget_and_what_was_added(tmp_path: Path) -> None:
    t0 = ts("2026-11-26T10:00:00")
    clock = [t0]
    k, _, _ = keeper(tmp_path, clock)
    k.book.observe([Held("a", "alice", 5, t0 - H)], now=t0, gap=90)
    k.book.add("carl", k.budgets.window(t0)[0], 4, by="admin")
    doc = k.budgets.everyone({"alice": [], "bea": []})
    assert doc["configured"] and doc["resets_at"] == "2026-11-27T00:00:00+00:00"
    rows = {u["user"]: u for u in doc["users"]}
    assert set(rows) == {"alice", "bea", "carl"}
    assert rows["alice"]["used_gib_hours"] == pytest.approx(5) and rows["carl"]["added_gib_hours"] == 4


def test_the_book_on_a_file_is_written_ahead_and_synced_at_checkpoints(tmp_path):
    """WAL with synchronous=NORMAL (1): the spawner reads while the service writes, and a commit
    costs no fsync of its own."""
    store = Book(tmp_path / "book.sqlite")
    try:
        assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 1
    finally:
        store.close()


@pytest.mark.parametrize("bad", ["Mars/Olympus", "", "../etc/passwd", 5, None])
def test_a_budget_time_zone_is_checked_once_naming_the_setting_and_the_fix(bad):
    from gpushare_hub.accounting.zones import budget_zone

    assert str(budget_zone("Europe/Berlin")) == "Europe/Berlin"
    setting = "c.GPUShareSpawner.quota_gib_hours_timezone"
    with pytest.raises(ValueError, match=rf"^{re.escape(setting)} .* is not a time zone"):
        budget_zone(bad, setting)
    with pytest.raises(ValueError, match="use an IANA name such as 'UTC'"):
        budget_zone(bad)
