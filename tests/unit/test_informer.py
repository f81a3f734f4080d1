"""LedgerInformer against a scripted API (lists and watch streams): relists keep one ledger."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from gpushare_hub.core import CardShare, Placement
from gpushare_hub.core.annotations import AllocationRecord
from gpushare_hub.kube import ApiError, LedgerInformer

from .helpers import node_obj, pod_obj


def bound(name: str, node: str, uuid: str, units: int, rv: str) -> dict[str, Any]:
    rec = AllocationRecord(node=node, cards=(CardShare(uuid, 0, units),), containers=())
    pod = pod_obj(name, units, node=node, annotations={"gpushare-hub.io/allocation": rec.to_json()})
    pod["metadata"]["resourceVersion"] = rv
    return pod


class Script:
    """One kind's API: each list() returns the next listing; each watch() plays the next stream."""

    def __init__(self, lists: list[list[dict[str, Any]]], streams: list[list[Any]]) -> None:
        self.lists = lists
        self.streams = streams
        self.watched_from: list[str] = []

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        items = self.lists.pop(0)
        return items, f"list-{len(self.lists)}"

    async def watch(self, rv: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watched_from.append(rv)
        if not self.streams:
            await asyncio.Event().wait()  # nothing more: a quiet watch
        for item in self.streams.pop(0):
            if isinstance(item, BaseException):
                raise item
            yield item


async def run_until(cond: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_a_pod_deleted_while_the_watch_was_expired_leaves_no_phantom_hold():
    uuid = "GPU-sim-gpu-1-0"
    a, b = bound("a", "gpu-1", uuid, 5, "10"), bound("b", "gpu-1", uuid, 3, "11")
    nodes = Script([[node_obj("gpu-1")]], [])
    pods = Script(
        # first list: a and b; after the 410, b was deleted and c added
        [[a, b], [a, bound("c", "gpu-1", uuid, 2, "20")]],
        [[("MODIFIED", a), ApiError(status=410, reason="too old")], []],
    )
    inf = LedgerInformer(None)
    inf._resources = {"nodes": nodes, "pods": pods}  # type: ignore[dict-item]
    ledger = inf.ledger
    seen: list[tuple[str, str]] = []
    inf.on_pod(lambda t, o: seen.append((t, o["metadata"]["name"])))
    await inf.start()
    await run_until(lambda: inf.relists == 3)
    await inf.stop()
    assert inf.ledger is ledger  # one ledger per process, never swapped
    assert sorted(x.key for x in ledger.allocations()) == ["jhub/a", "jhub/c"]
    assert ledger.used("gpu-1", uuid) == 7
    assert ("DELETED", "b") in seen
    assert pods.watched_from[:2] == ["list-1", "list-0"]  # each watch starts from its own list


async def test_a_relist_tells_subscribers_of_every_object_that_vanished_not_only_card_holders():
    """A pending GPU pod (no card) and a node deleted while the watch was expired: the hub
    service's pending list and node boxes must not keep them for good."""
    pending = pod_obj("pending", 5, phase="Pending")
    pods = Script([[pending], []], [[ApiError(status=410, reason="too old")], []])
    nodes = Script(
        [[node_obj("gpu-1"), node_obj("gpu-2")], [node_obj("gpu-1")]], [[ApiError(status=410)], []]
    )
    inf = LedgerInformer(None)
    inf._resources = {"nodes": nodes, "pods": pods}  # type: ignore[dict-item]
    seen: list[tuple[str, str]] = []
    inf.on_pod(lambda t, o: seen.append((t, o["metadata"]["name"])))
    inf.on_node(lambda t, o: seen.append((t, o["metadata"]["name"])))
    await inf.start()
    await run_until(lambda: inf.relists == 4)
    await inf.stop()
    assert ("DELETED", "pending") in seen
    assert ("DELETED", "gpu-2") in seen and ("DELETED", "gpu-1") not in seen


async def test_a_relist_keeps_a_reservation_its_binder_protects():
    inf = LedgerInformer(None, protect=lambda key, listed_at: key == "jhub/inflight")
    nodes = Script([[node_obj("gpu-1")]], [])
    pods = Script([[], []], [])
    inf._resources = {"nodes": nodes, "pods": pods}  # type: ignore[dict-item]
    await inf.relist("nodes")
    for name in ("inflight", "done"):
        inf.ledger.commit(Placement(f"jhub/{name}", "gpu-1", (CardShare("GPU-sim-gpu-1-0", 0, 4),)))
    await inf.relist("pods")
    assert [x.key for x in inf.ledger.allocations()] == ["jhub/inflight"]


async def test_stale_for_grows_while_a_watch_fails_and_returns_to_zero():
    now = [100.0]
    inf = LedgerInformer(None, clock=lambda: now[0])
    assert inf.stale_for() == float("inf")  # not listed yet
    nodes = Script([[node_obj("gpu-1")]], [[ConnectionResetError("reset")], []])
    pods = Script([[]], [])
    inf._resources = {"nodes": nodes, "pods": pods}  # type: ignore[dict-item]
    await inf.start()
    await run_until(lambda: inf._failing_since["nodes"] is not None)
    now[0] += 42.0
    assert inf.stale_for() == 42.0
    await run_until(lambda: inf.stale_for() == 0.0)  # the next watch opened
    await inf.stop()


def test_a_node_whose_inventory_breaks_loses_its_cards_and_says_why():
    inf = LedgerInformer(None)
    inf.apply("nodes", "ADDED", node_obj("gpu-1"))
    inf.apply("pods", "ADDED", bound("a", "gpu-1", "GPU-sim-gpu-1-0", 5, "1"))
    broken = node_obj("gpu-1")
    broken["metadata"]["annotations"]["gpushare-hub.io/cards"] = "[{not json"
    inf.apply("nodes", "MODIFIED", broken)
    assert inf.ledger.node("gpu-1") is None
    assert "not JSON" in (inf.ledger.unreadable("gpu-1") or "")
    snap = inf.ledger.snapshot()
    assert snap["unreadable"][0]["pods"] == [{"pod": "jhub/a", "units": 5}]
    inf.apply("nodes", "MODIFIED", node_obj("gpu-1"))
    assert inf.ledger.unreadable("gpu-1") is None and inf.ledger.used("gpu-1", "GPU-sim-gpu-1-0") == 5
