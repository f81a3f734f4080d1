"""LedgerInformer against a scripted API (lists and watch streams): relists keep one ledger."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpushare_hub.core import CardShare, Placement
from gpushare_hub.core.annotations import AllocationRecord
from gpushare_hub.kube import ApiError, LedgerInformer
from gpushare_hub.kube.api import Page, paged

from .helpers import node_obj, pod_obj


def bound(name: str, node: str, uuid: str, units: int, rv: str) -> dict[str, Any]:
    rec = AllocationRecord(node=node, cards=(CardShare(uuid, 0, units),), containers=())
    pod = pod_obj(name, units, node=node, annotations={"gpushare-hub.io/allocation": rec.to_json()})
    pod["metadata"]["resourceVersion"] = rv
    return pod


class Script:
    """One kind's API: each list starts the next listing and serves it ``limit`` objects a page;
    each watch() plays the next stream. ``expire``: continue tokens answered 410, and how often."""

    def __init__(
        self,
        lists: list[list[dict[str, Any]]],
        streams: list[list[Any]],
        expire: dict[str, int] | None = None,
    ) -> None:
        self.lists = lists
        self.streams = streams
        self.expire = dict(expire or {})
        self.watched_from: list[str] = []
        self.asked: list[tuple[int, str]] = []  # (limit, continue) of each list call
        self._listing: list[dict[str, Any]] = []
        self._rv = ""

    async def list_page(self, limit: int, cont: str) -> tuple[list[dict[str, Any]], str, str]:
        self.asked.append((limit, cont))
        if self.expire.get(cont, 0) > 0:
            self.expire[cont] -= 1
            raise ApiError(status=410, reason="The provided continue parameter is too old")
        if not cont:
            self._listing = self.lists.pop(0)
            self._rv = f"list-{len(self.lists)}"
        start = int(cont or 0)
        end = len(self._listing) if limit == 0 else start + limit
        more = end < len(self._listing)
        return self._listing[start:end], self._rv, str(end) if more else ""

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
    inf.on_pod(lambda t, o: seen.append((t, o.name)))
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
    inf.on_pod(lambda t, o: seen.append((t, o.name)))
    inf.on_node(lambda t, o: seen.append((t, o.name)))
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


# ---- lists in pages -----------------------------------------------------------------------------


def pods(n: int) -> list[dict[str, Any]]:
    return [pod_obj(f"p{i}", phase="Running") for i in range(n)]


async def pages_of(script: Script, limit: int, restarts: int = 2) -> list[Page]:
    return [page async for page in paged(script.list_page, limit, restarts)]


async def test_a_list_is_read_page_by_page_with_the_continue_token_of_each_answer():
    script = Script([pods(5)], [])
    got = await pages_of(script, 2)
    assert [[o["metadata"]["name"] for o in p.items] for p in got] == [["p0", "p1"], ["p2", "p3"], ["p4"]]
    assert script.asked == [(2, ""), (2, "2"), (2, "4")]
    assert [p.restart for p in got] == [False, False, False]
    assert got[-1].resource_version == "list-0"


async def test_an_expired_continue_token_starts_the_list_again_from_its_first_page():
    script = Script([pods(5), pods(3)], [], expire={"4": 1})
    got = await pages_of(script, 2)
    assert script.asked == [(2, ""), (2, "2"), (2, "4"), (2, ""), (2, "2")]
    assert [(len(p.items), p.restart) for p in got] == [(2, False), (2, False), (2, True), (1, False)]
    assert got[-1].resource_version == "list-0"  # the list that completed: the second one


async def test_a_token_that_keeps_expiring_ends_in_one_whole_list():
    script = Script([pods(5), pods(5), pods(5)], [], expire={"2": 2})
    got = await pages_of(script, 2, restarts=1)
    assert script.asked == [(2, ""), (2, "2"), (2, ""), (2, "2"), (0, "")]
    assert [(len(p.items), p.restart) for p in got] == [(2, False), (2, True), (5, True)]


async def test_a_410_on_a_first_page_is_raised_it_is_no_expired_continue_token():
    script = Script([pods(5)], [], expire={"": 1})
    with pytest.raises(ApiError) as err:
        await pages_of(script, 2)
    assert err.value.status == 410 and script.asked == [(2, "")]


async def test_other_errors_on_a_later_page_are_raised():
    script = Script([pods(5)], [])

    async def fails(limit: int, cont: str) -> tuple[list[dict[str, Any]], str, str]:
        if cont == "2":
            raise ApiError(status=500, reason="etcd timed out")
        return await script.list_page(limit, cont)

    with pytest.raises(ApiError) as err:
        _ = [p async for p in paged(fails, 2)]
    assert err.value.status == 500 and script.asked == [(2, "")]


async def test_a_relist_applies_every_page_and_the_watch_resumes_from_the_last_one():
    uuid = "GPU-sim-gpu-1-0"
    holders = [bound(f"h{i}", "gpu-1", uuid, 1, str(i)) for i in range(5)]
    nodes = Script([[node_obj("gpu-1")]], [])
    pod_api = Script([holders], [])
    inf = LedgerInformer(None, page_size=2)
    inf._resources = {"nodes": nodes, "pods": pod_api}  # type: ignore[dict-item]
    await inf.start()
    await run_until(lambda: bool(pod_api.watched_from))
    await inf.stop()
    assert pod_api.asked == [(2, ""), (2, "2"), (2, "4")]
    assert inf.ledger.used("gpu-1", uuid) == 5
    assert pod_api.watched_from == ["list-0"]


async def test_a_pod_gone_when_an_expired_list_starts_again_is_told_deleted_and_holds_nothing():
    """The first pages of a list counted ``gone``; its token expired, and the list that completed
    no longer shows it: it must not keep a card, and subscribers must forget it."""
    uuid = "GPU-sim-gpu-1-0"
    gone, kept = bound("gone", "gpu-1", uuid, 5, "1"), bound("kept", "gpu-1", uuid, 3, "2")
    others = pods(3)
    nodes = Script([[node_obj("gpu-1")]], [])
    pod_api = Script([[gone, kept, *others], [kept, *others]], [], expire={"2": 1})
    inf = LedgerInformer(None, page_size=2)
    inf._resources = {"nodes": nodes, "pods": pod_api}  # type: ignore[dict-item]
    seen: list[tuple[str, str]] = []
    inf.on_pod(lambda t, o: seen.append((t, o.name)))
    await inf.relist("nodes")
    await inf.relist("pods")
    assert [a.key for a in inf.ledger.allocations()] == ["jhub/kept"]
    assert inf.ledger.used("gpu-1", uuid) == 3
    assert seen[-1] == ("DELETED", "gone") and seen.count(("DELETED", "gone")) == 1
    assert ("DELETED", "kept") not in seen
    assert inf._rv["pods"] == "list-0"


def test_each_allocation_that_ends_is_recorded_for_the_waiting_spawns_estimates():
    from gpushare_hub.core.releases import Release, ReleaseHistory

    uuid = "GPU-sim-gpu-1-0"
    history = ReleaseHistory(started=0.0)
    clock = [100.0]
    inf = LedgerInformer(None, clock=lambda: clock[0], releases=history)
    inf.apply("nodes", "ADDED", node_obj("gpu-1"))
    a, b = bound("a", "gpu-1", uuid, 5, "1"), bound("b", "gpu-1", uuid, 7, "2")
    inf.apply("pods", "ADDED", a)
    inf.apply("pods", "ADDED", b)
    inf.apply("pods", "MODIFIED", a)  # still held: nothing ended
    assert len(history) == 0
    clock[0] = 700.0
    inf.apply("pods", "DELETED", a)
    done = {**b, "status": {**b["status"], "phase": "Succeeded"}}
    clock[0] = 900.0
    inf.apply("pods", "MODIFIED", done)  # a finished pod frees its slice too
    inf.apply("pods", "DELETED", done)  # and is not counted twice
    inf.apply("pods", "DELETED", pod_obj("never-held", 5))
    assert list(history._items) == [Release(700.0, "Tesla-T4", 5, 1), Release(900.0, "Tesla-T4", 7, 1)]
