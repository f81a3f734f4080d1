"""Issue 37: a server whose processes stay over its slice gets the admin's action, warned first;
the status bar says so and names the processes from the container ledger."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from gpushare_hub.core.names import (
    OVER_SLICE_NOTIFIED_REASON,
    OVER_SLICE_STOPPED_REASON,
    OVER_SLICE_WARNING_REASON,
)
from gpushare_hub.notebook.overslice import over_problem, over_warning, server_processes
from gpushare_hub.service.enforcer import Enforcer
from gpushare_hub.service.held import HeldSlice
from gpushare_hub.service.hubroles import returns_servers
from gpushare_hub.service.overslice import NOTIFY, STOP, OverSlicePolicy, OverSliceRule
from tests.support.fake_hubapi import FakeHub

pytestmark = pytest.mark.unit

NOW = 1_800_000_000


def over(used_mib: int = 6963, over_slice: bool = True) -> HeldSlice:
    return HeldSlice("jhub", "jupyter-ana", "ana", "", 5, used_mib=used_mib, over_slice=over_slice)


def ticks(
    rule: OverSliceRule, hub: FakeHub, script: list[tuple[int, list[HeldSlice]]]
) -> list[tuple[Any, ...]]:
    """Passes at the given seconds after NOW with what is held then; the events posted."""
    events: list[tuple[Any, ...]] = []
    clock = [float(NOW)]

    async def post(namespace: str, pod: str, reason: str, message: str) -> None:
        events.append((namespace, pod, reason, message))

    enforcer, policy = Enforcer(hub, post, clock=lambda: clock[0]), OverSlicePolicy(rule)  # type: ignore[arg-type]

    async def go() -> None:
        for at, held in script:
            clock[0] = NOW + at
            await enforcer.tick(policy, held, {})

    asyncio.run(go())
    return events


def test_stop_warns_once_after_the_grace_then_stops_once():
    hub = FakeHub()
    rule = OverSliceRule(STOP, after=300, warn_before=300)
    events = ticks(rule, hub, [(at, [over()]) for at in (0, 200, 300, 400, 600, 660)])
    assert [e[2] for e in events] == [OVER_SLICE_WARNING_REASON, OVER_SLICE_STOPPED_REASON]
    warning = events[0][3]
    assert "holds 6.8 GiB of GPU memory, more than its 5 GiB slice, for 5 min" in warning, warning
    assert "It will be stopped in 5 min unless it goes back under its slice" in warning, warning
    assert hub.calls == [("stop", "ana", "")]


def test_going_back_under_the_slice_ends_the_stretch_and_nothing_is_stopped():
    hub = FakeHub()
    rule = OverSliceRule(STOP, after=300, warn_before=300)
    under = over(used_mib=4000, over_slice=False)
    events = ticks(
        rule, hub, [(0, [over()]), (300, [over()]), (400, [under]), (600, [over()]), (800, [over()])]
    )
    # Warned once; back under at 400 s; over again from 600 s: a new stretch, not yet due.
    assert [e[2] for e in events] == [OVER_SLICE_WARNING_REASON] and hub.calls == []


def test_notify_only_tells_once_per_stretch_and_none_does_nothing():
    hub = FakeHub()
    events = ticks(OverSliceRule(NOTIFY, after=60), hub, [(0, [over()]), (60, [over()]), (120, [over()])])
    assert [e[2] for e in events] == [OVER_SLICE_NOTIFIED_REASON] and hub.calls == []
    assert ticks(OverSliceRule(), hub, [(0, [over()]), (10_000, [over()])]) == []


def test_a_refused_stop_is_tried_again_and_the_service_role_gets_the_servers_scope():
    hub = FakeHub(stop_status=403)
    ticks(OverSliceRule(STOP, after=1, warn_before=0), hub, [(0, [over()]), (1, [over()]), (2, [over()])])
    assert hub.calls == [("stop", "ana", "")] * 2
    assert returns_servers({"gpu_idle_action": "notify", "over_slice_action": "stop"})
    assert not returns_servers({"gpu_idle_action": "notify", "over_slice_action": "notify"})


def test_the_status_bar_counts_down_and_names_the_servers_processes(tmp_path):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    me = os.getpid()
    with open(f"/proc/{me}/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    (ledger / f"{me}.json").write_text(
        json.dumps({"pid": me, "start": start, "held": 3 * 2**30, "what": "a.ipynb"})
    )
    (ledger / "x.json").write_text("{broken")
    processes = server_processes({"GPUSHARE_LEDGER_DIR": str(ledger)})
    assert processes == [(me, 3 * 2**30, "a.ipynb")]
    alloc = {
        "over_slice": True,
        "over_slice_return": {
            "action": "stop",
            "phase": "warn",
            "seconds_left": 240,
            "words": "It will be stopped.",
        },
    }
    assert over_warning(alloc) == "GPU over slice: stopped in 4 min"
    assert over_problem(alloc, processes) == "It will be stopped. Its GPU processes: a.ipynb 3.0 GiB."
    assert over_warning({"over_slice": True, "over_slice_return": None}) == "GPU over slice"
    assert over_warning({"over_slice": False}) == "" and over_problem({"over_slice": False}, processes) == ""
    assert (
        server_processes({}) == [] and server_processes({"GPUSHARE_LEDGER_DIR": str(tmp_path / "none")}) == []
    )
