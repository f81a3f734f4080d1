"""Idle slices come back: the rule (who, what, when), the store across restarts, the loop that
acts once per idle stretch, and Keep; and hibernate, which the notebook server does, the service
only saying when (``hibernate_after`` in api/v1/me). The hub tier runs it against a real hub."""

from __future__ import annotations

import asyncio

import pytest

from gpushare_hub.accounting.book import Book
from gpushare_hub.accounting.records import IdleAction
from gpushare_hub.core.names import IDLE_RETURNED_REASON, IDLE_WARNING_REASON
from gpushare_hub.service.enforcer import Enforcer
from gpushare_hub.service.held import HeldSlice
from gpushare_hub.service.hubroles import returns_servers
from gpushare_hub.service.hubservers import seconds_of
from gpushare_hub.service.idle import (
    DUE,
    HIBERNATE,
    IDLE,
    NONE,
    NOTIFY,
    PARK,
    STOP,
    WARNING,
    IdleRule,
    idle_states,
)
from gpushare_hub.service.idlepolicy import IdlePolicy
from tests.support.fake_hubapi import FakeHub
from tests.support.golden import me_document_golden

NOW = 1_800_000_000
RULE = IdleRule(action=PARK, return_after=7200, warn_before=600, keep_seconds=3600, park_profile="cpu")


def alloc(user: str = "ana", idle: int | None = 6600, server: str = "", slice_: str = "t4-5g") -> HeldSlice:
    return HeldSlice(
        namespace="jhub",
        pod=f"jupyter-{user}",
        user=user,
        server=server,
        units=5,
        slice=slice_,
        since=seconds_of("2026-11-26T08:00:00Z"),
        idle_since=None if idle is None else NOW - idle,
    )


def test_the_warning_says_how_long_it_has_been_idle_and_when_it_is_returned():
    [s] = idle_states([alloc(idle=6600)], {}, RULE, {}, NOW)
    assert (s.phase, s.action, s.deadline, s.can_keep) == (WARNING, PARK, NOW + 600, True)
    assert s.words(NOW) == (
        "your GPU has been idle for 1 h 50 min; in 10 min it goes back and your server restarts "
        "without a GPU (your files and image stay), unless you use it or press Keep."
    )
    [early] = idle_states([alloc(idle=3000)], {}, RULE, {}, NOW)
    assert early.phase == IDLE
    [due] = idle_states([alloc(idle=7200)], {}, RULE, {}, NOW)
    assert due.phase == DUE and "is being returned" in due.words(NOW)
    # working, or not measured: no idle state at all
    assert idle_states([alloc(idle=None), alloc(user="", idle=9000)], {}, RULE, {}, NOW) == []


def test_the_action_comes_from_exempt_groups_then_the_slice_then_the_mildest_group_then_the_default():
    rule = IdleRule(
        action=STOP,
        per_group={"students": STOP, "thesis": NOTIFY, "class": PARK},
        per_slice={"t4-whole": NOTIFY},
        exempt_groups=("staff",),
    )
    assert rule.action_for(["staff", "students"], "t4-5g") == NONE
    assert rule.action_for(["students"], "t4-whole") == NOTIFY
    assert rule.action_for(["students", "thesis"], "t4-5g") == NOTIFY
    assert rule.action_for(["students", "class"], "t4-5g") == PARK
    assert rule.action_for([], "t4-5g") == STOP
    states = idle_states([alloc(idle=9000)], {"ana": ["staff"]}, rule, {}, NOW)
    assert states == []  # exempt: never warned, never returned


def test_keep_puts_the_deadline_off_once_per_stretch_and_a_new_stretch_starts_afresh():
    [s] = idle_states([alloc(idle=6600)], {}, RULE, {}, NOW)
    keeps = {("ana", "", s.stretch): NOW + 3600}
    [kept] = idle_states([alloc(idle=6600)], {}, RULE, keeps, NOW)
    assert (kept.deadline, kept.phase, kept.can_keep) == (NOW + 3600, IDLE, False)
    assert "(you pressed Keep once), unless you use it." in kept.words(NOW + 3000)
    # The user worked, then went idle again: another stretch, the old Keep does not apply.
    [again] = idle_states([alloc(idle=6600 - 5000)], {}, RULE, keeps, NOW + 5000)
    assert again.stretch != s.stretch and again.kept_until is None


def test_an_idle_clock_from_the_future_counts_from_now():
    [s] = idle_states([alloc(idle=-600)], {}, RULE, {}, NOW)
    assert (s.idle_seconds, s.deadline, s.phase) == (0, NOW + 7200, IDLE)


def test_the_store_keeps_keeps_and_actions_across_a_restart(tmp_path):
    path = tmp_path / "hub" / "gpushare-service.sqlite"
    store = Book(path)
    assert store.keep("ana", "", "s1", NOW + 3600, NOW)
    assert not store.keep("ana", "", "s1", NOW + 7200, NOW)  # once
    assert store.record_idle(IdleAction("ana", "", "s1", "parked", "t4-5g", 5, NOW, 7200, "cpu"))
    assert not store.record_idle(IdleAction("ana", "", "s1", "parked", "t4-5g", 5, NOW + 1, 7201, "cpu"))
    store.close()
    reopened = Book(path)
    assert reopened.keeps(["ana"]) == {("ana", "", "s1"): NOW + 3600}
    assert reopened.idle_done("ana", "", "s1") == {"parked"}
    [back] = reopened.returned("ana", NOW - 86400)
    assert (back.what, back.slice, back.idle_seconds, back.detail) == ("parked", "t4-5g", 7200, "cpu")
    assert reopened.returned("bo", 0) == []
    reopened.forget_before(NOW + 1)
    assert reopened.returned("ana", 0) == []


Returner = tuple[Enforcer, IdlePolicy]


def returner(store: Book, hub: FakeHub, clock: list[int], rule: IdleRule = RULE) -> tuple[Returner, list]:
    """The enforcer with the idle policy, as the service's pass drives them."""
    events: list[tuple] = []

    async def post(namespace, pod, reason, message):
        events.append((namespace, pod, reason, message))

    return (Enforcer(hub, post, clock=lambda: clock[0]), IdlePolicy(rule, store)), events  # type: ignore[arg-type]


def run_ticks(r: Returner, held: list[HeldSlice], n: int = 1) -> list:
    enforcer, policy = r

    async def go():
        acted = []
        for _ in range(n):
            acted += await enforcer.tick(policy, held, {})
        await enforcer.settled()
        return acted

    return asyncio.run(go())


def test_the_loop_warns_once_then_parks_once_and_a_restarted_service_does_not_act_again(tmp_path, caplog):
    store, hub, clock = Book(tmp_path / "db.sqlite"), FakeHub(), [NOW]
    r, events = returner(store, hub, clock)
    doc = [alloc(idle=6600)]
    run_ticks(r, doc, 3)
    assert [e[2] for e in events] == [IDLE_WARNING_REASON] and hub.calls == []
    assert "your server restarts without a GPU" in events[0][3]
    clock[0] = NOW + 600  # the deadline
    with caplog.at_level("WARNING", logger="gpushare.service"):
        run_ticks(r, doc, 2)
    assert [e[2] for e in events] == [IDLE_WARNING_REASON, IDLE_RETURNED_REASON]
    returned = {"slice": "t4-5g", "units": 5, "idle_seconds": 7200}
    assert hub.calls == [
        ("stop", "ana", ""),
        ("start", "ana", "", {"profile": "cpu", "gpushare_returned": returned}),
    ]
    line = next(r.message for r in caplog.records if "idle GPU slice of ana" in r.message)
    assert "held for 7200 s (2 h)" in line and "rule: park after 7200 s" in line and "profile 'cpu'" in line
    # The service restarts: the store says the stretch was parked; nothing happens twice.
    r2, events2 = returner(Book(tmp_path / "db.sqlite"), hub, clock)
    run_ticks(r2, doc, 2)
    assert events2 == [] and len(hub.calls) == 2


def test_stop_stops_notify_only_tells_and_a_refused_stop_is_tried_again(tmp_path, caplog):
    clock = [NOW]
    hub = FakeHub()
    r, events = returner(Book(tmp_path / "a.sqlite"), hub, clock, IdleRule(action=STOP, return_after=60))
    run_ticks(r, [alloc(idle=60)])
    assert hub.calls == [("stop", "ana", "")] and events[-1][2] == IDLE_RETURNED_REASON
    hub = FakeHub()
    r, events = returner(Book(tmp_path / "b.sqlite"), hub, clock, IdleRule(action=NOTIFY, return_after=60))
    run_ticks(r, [alloc(idle=60)], 2)
    assert hub.calls == [] and [e[2] for e in events] == ["GPUShareIdle"]
    hub = FakeHub(stop_status=403)
    r, events = returner(Book(tmp_path / "c.sqlite"), hub, clock, IdleRule(action=STOP, return_after=60))
    with caplog.at_level("ERROR", logger="gpushare.service"):
        run_ticks(r, [alloc(idle=60)], 2)
    assert hub.calls == [("stop", "ana", "")] * 2  # not recorded as done: tried on the next pass
    assert "needs the 'servers' scope" in caplog.text


@pytest.mark.parametrize("action", [STOP, PARK])
def test_nothing_is_returned_while_the_slice_works(tmp_path, action):
    hub = FakeHub()
    r, events = returner(
        Book(tmp_path / "db.sqlite"), hub, [NOW], IdleRule(action=action, park_profile="cpu")
    )
    run_ticks(r, [alloc(idle=None)], 2)
    assert hub.calls == [] and events == []


# ---- hibernate: the notebook server hibernates idle kernels; the service only says when --------
HIBERNATING = IdleRule(action=HIBERNATE, return_after=1800, warn_before=600)


def test_hibernate_sits_between_notify_and_park_and_the_mildest_of_the_groups_applies():
    rule = IdleRule(
        action=STOP,
        per_group={"students": STOP, "class": PARK, "lab": HIBERNATE, "thesis": NOTIFY},
        per_slice={"t4-whole": HIBERNATE},
        exempt_groups=("staff",),
        return_after=1800,
        park_profile="cpu",
    )
    assert rule.action_for(["students", "lab"], "t4-5g") == HIBERNATE
    assert rule.action_for(["class", "lab"], "t4-5g") == HIBERNATE
    assert rule.action_for(["lab", "thesis"], "t4-5g") == NOTIFY
    assert rule.action_for(["students"], "t4-whole") == HIBERNATE  # the slice's first
    assert rule.hibernate_after(["lab"], "t4-5g") == 1800
    assert rule.hibernate_after(["students"], "t4-whole") == 1800
    assert rule.hibernate_after(["class"], "t4-5g") is None
    assert rule.hibernate_after(["staff", "lab"], "t4-whole") is None  # exempt: nothing happens
    assert rule.hibernate_after([], "t4-5g") is None


def test_a_hibernating_slice_is_never_warned_and_its_words_say_kernels_hibernate_and_wake():
    [early] = idle_states([alloc(idle=1500)], {}, HIBERNATING, {}, NOW)  # in warn_before of 1800
    [due] = idle_states([alloc(idle=9000)], {}, HIBERNATING, {}, NOW)
    assert (early.action, early.phase, early.can_keep) == (HIBERNATE, IDLE, False)
    assert (due.phase, due.can_keep) == (DUE, False)
    for s in (early, due):
        words = s.words(NOW)
        assert "A kernel that runs nothing for 30 min hibernates" in words, words
        assert "its GPU memory goes back to the card" in words and "every variable intact" in words
        assert "your server keeps running" in words.lower()
        assert "stops" not in words and "restarts" not in words and "Keep" not in words


def test_the_service_never_warns_tells_stops_or_parks_a_hibernating_slice(tmp_path):
    hub, clock = FakeHub(), [NOW]
    r, events = returner(Book(tmp_path / "db.sqlite"), hub, clock, HIBERNATING)
    run_ticks(r, [alloc(idle=1500)], 2)  # where stop or park would warn
    clock[0] = NOW + 7200  # long past the deadline
    assert run_ticks(r, [alloc(idle=9000)], 2) == []
    assert hub.calls == [] and events == []
    # Hibernation asks nothing of the hub: the service's role gets no servers scope for it.
    assert not returns_servers({"gpu_idle_action": "hibernate"})
    assert not returns_servers({"gpu_idle_action_per_group": {"lab": "hibernate"}})


def test_me_gives_every_allocation_hibernate_after_from_the_rule_for_its_groups_and_slice():
    """The contract the notebook server's extension reads: ``hibernate_after`` on every
    allocation, the rule's seconds where the action for the caller's groups (alice: students)
    and the allocation's slice (t4-5g) is hibernate, else null."""
    (parked,) = me_document_golden()["allocations"]  # the golden rule parks
    assert "hibernate_after" in parked and parked["hibernate_after"] is None
    (mine,) = me_document_golden(HIBERNATING)["allocations"]
    assert mine["hibernate_after"] == 1800 and isinstance(mine["hibernate_after"], int)
    ret = mine["idle_return"]  # idle for 1 h 50 min: due, but only kernels hibernate
    assert (ret["action"], ret["phase"], ret["can_keep"]) == (HIBERNATE, DUE, False)
    assert "hibernates" in ret["words"] and "every variable intact" in ret["words"]
    assert "stops" not in ret["words"] and "restarts" not in ret["words"]
    by_group = IdleRule(action=PARK, per_group={"students": HIBERNATE}, return_after=900, park_profile="cpu")
    (mine,) = me_document_golden(by_group)["allocations"]
    assert mine["hibernate_after"] == 900
    by_slice = IdleRule(action=HIBERNATE, per_slice={"t4-5g": STOP}, return_after=900)
    (mine,) = me_document_golden(by_slice)["allocations"]
    assert mine["hibernate_after"] is None and mine["idle_return"]["action"] == STOP
    exempt = IdleRule(action=HIBERNATE, exempt_groups=("students",))
    (mine,) = me_document_golden(exempt)["allocations"]
    assert mine["hibernate_after"] is None and mine["idle_return"] is None
