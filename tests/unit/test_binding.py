"""The binder's three outcomes against a scripted API server: applied, refused, answer lost."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from gpushare_hub.core import Ledger, PodObject
from gpushare_hub.extender.binding import Binder, Outcome, Phase
from gpushare_hub.extender.decisions import Decisions
from gpushare_hub.kube import ApiError
from tests.objects import read_node, read_pod

from .helpers import node_obj, pod_obj


class FakeKube:
    """Holds pods; ``bind_fails`` decides what the next Binding does."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.bind_fails: BaseException | None = None
        self.apply_despite_failure = False
        self.reads_fail: BaseException | None = None
        self.gate: asyncio.Event | None = None

    async def get_pod(self, namespace: str, name: str) -> PodObject:
        if self.reads_fail:
            raise self.reads_fail
        pod = self.pods.get(f"{namespace}/{name}")
        if pod is None:
            raise ApiError(status=404, reason="not found")
        return read_pod(copy.deepcopy(pod))

    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        if self.gate is not None:
            await self.gate.wait()
        pod = self.pods[f"{namespace}/{name}"]
        if self.bind_fails is None or self.apply_despite_failure:
            if pod["spec"].get("nodeName"):
                raise ApiError(status=409, reason="already assigned")
            pod["spec"]["nodeName"] = node
            pod["metadata"]["annotations"].update(annotations)
        if self.bind_fails is not None:
            raise self.bind_fails


def make(settle: float = 0.3) -> tuple[Binder, FakeKube, Ledger]:
    ledger = Ledger()
    ledger.observe_node(read_node(node_obj("gpu-1")))
    kube = FakeKube()
    decisions = Decisions(ledger)
    binder = Binder(kube, lambda: decisions, ledger.names, settle=settle)  # type: ignore[arg-type]
    return binder, kube, ledger


async def test_a_refused_binding_frees_the_card_at_once():
    binder, kube, ledger = make()
    kube.pods["jhub/a"] = pod_obj("a", 5)
    kube.bind_fails = ApiError(status=422, reason="pod is being deleted")
    result = await binder.bind("jhub", "a", "uid-a", "gpu-1")
    assert result.outcome is Outcome.FAILED and "422" in result.error()
    assert ledger.allocation("jhub/a") is None and binder.phase("jhub/a") is None


@pytest.mark.parametrize("applied", [True, False])
async def test_a_lost_answer_keeps_the_card_until_the_api_server_shows_the_outcome(applied):
    binder, kube, ledger = make()
    kube.pods["jhub/a"] = pod_obj("a", 5)
    kube.bind_fails, kube.apply_despite_failure = TimeoutError(), applied
    kube.reads_fail = ConnectionRefusedError("API server down")
    binder.remember(read_pod(pod_obj("a", 5)))  # as filter saw it
    result = await binder.bind("jhub", "a", "uid-a", "gpu-1")
    assert result.outcome is Outcome.UNKNOWN and "stays reserved" in result.error()
    assert ledger.totals()[0] == 5 and binder.phase("jhub/a") is Phase.UNKNOWN
    # kube-scheduler retries: answered, never released, while the API server is away
    again = await binder.bind("jhub", "a", "uid-a", "gpu-1")
    assert again.outcome is Outcome.UNKNOWN and ledger.totals()[0] == 5
    await asyncio.sleep(0.6)
    assert ledger.totals()[0] == 5  # still no answer: still held
    kube.reads_fail = None
    for _ in range(100):
        if binder.phase("jhub/a") is not Phase.UNKNOWN:
            break
        await asyncio.sleep(0.05)
    if applied:
        assert binder.phase("jhub/a") is Phase.CONFIRMED and ledger.totals()[0] == 5
        replay = await binder.bind("jhub", "a", "uid-a", "gpu-1")
        assert replay.outcome is Outcome.ALREADY_BOUND and ledger.totals()[0] == 5
    else:
        assert binder.phase("jhub/a") is None and ledger.totals()[0] == 0
    await binder.stop()


async def test_a_second_bind_while_the_first_is_in_flight_changes_nothing():
    binder, kube, ledger = make()
    kube.pods["jhub/a"] = pod_obj("a", 5)
    kube.gate = asyncio.Event()
    first = asyncio.create_task(binder.bind("jhub", "a", "uid-a", "gpu-1"))
    await asyncio.sleep(0.05)
    second = await binder.bind("jhub", "a", "uid-a", "gpu-1")
    assert second.outcome is Outcome.IN_PROGRESS and ledger.totals()[0] == 5
    kube.gate.set()
    assert (await first).outcome is Outcome.BOUND
    assert ledger.totals()[0] == 5


async def test_a_pod_copy_from_filter_time_is_not_trusted_once_the_ledger_holds_the_pod():
    binder, kube, ledger = make()
    kube.pods["jhub/a"] = pod_obj("a", 5)
    binder.remember(read_pod(pod_obj("a", 5)))
    assert (await binder.bind("jhub", "a", "uid-a", "gpu-1")).outcome is Outcome.BOUND
    binder.on_pod("MODIFIED", read_pod(kube.pods["jhub/a"]))  # the watch saw it bound: settled
    ledger.observe_pod(read_pod(kube.pods["jhub/a"]))
    binder.remember(read_pod(pod_obj("a", 5)))  # a replayed filter, unbound copy
    replay = await binder.bind("jhub", "a", "uid-a", "gpu-1")
    assert replay.outcome is Outcome.ALREADY_BOUND and ledger.totals()[0] == 5
