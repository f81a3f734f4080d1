"""The shared ledger hands out the informer's ledger only while it is current."""

from __future__ import annotations

import math

from gpushare_hub.core import Ledger
from gpushare_hub.kube.ledger_source import SharedLedger


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeInformer:
    """Shaped like gpushare_hub.kube's informer; what is tested is SharedLedger's policy."""

    started = 0

    def __init__(self, fail: bool = False) -> None:
        self.ledger = Ledger()
        self.synced = False
        self.fail = fail
        self.stale = 0.0

    async def start(self) -> None:
        FakeInformer.started += 1
        if self.fail:
            raise ConnectionRefusedError("connection refused")
        self.synced = True

    def stale_for(self) -> float:
        return self.stale if self.synced else math.inf


async def test_started_once_and_stale_ledgers_are_withheld():
    made: list[FakeInformer] = []

    def make() -> FakeInformer:
        made.append(FakeInformer())
        return made[-1]

    shared = SharedLedger(make, max_stale=30)
    assert shared() is None
    await shared.ensure_started()
    await shared.ensure_started()
    assert len(made) == 1 and shared() is made[0].ledger
    made[0].stale = 31.0
    assert shared() is None
    made[0].stale = 0.0
    assert shared() is made[0].ledger


async def test_a_failed_first_list_is_retried_after_a_pause(caplog):
    clock = Clock()
    attempts = [FakeInformer(fail=True), FakeInformer()]
    shared = SharedLedger(lambda: attempts.pop(0), retry_after=10, clock=clock)
    await shared.ensure_started()
    assert shared() is None and "list and watch on nodes and on pods in all namespaces" in caplog.text
    await shared.ensure_started()  # too soon: not retried
    assert len(attempts) == 1
    clock.now = 11
    await shared.ensure_started()
    assert shared() is not None and not attempts
