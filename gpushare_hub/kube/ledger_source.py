"""A process's one ledger: a shared informer, started on first use, trusted only while fresh.

The hub's spawners share one, and the hub service keeps its own. :class:`SharedLedger`
wraps anything shaped like :class:`~gpushare_hub.kube.informer.LedgerInformer`
(``start()``, ``ledger``, ``synced``, ``stale_for()``) and is a
:data:`~gpushare_hub.core.availability.LedgerProvider`: it returns the ledger only
while the informer has listed once and no watch has been failing for longer than
``max_stale`` seconds. Otherwise ``None``, and the spawner (or the service) says
availability is unknown instead of deciding on old numbers (a spawn is then not held
back, and a waiting one is never failed as "never fits").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from ..core.ledger import Ledger

log = logging.getLogger("gpushare.ledger")


class Informer(Protocol):
    ledger: Ledger
    synced: bool

    async def start(self) -> None: ...

    def stale_for(self) -> float: ...


class SharedLedger:
    """Starts ``make()`` once (retrying after ``retry_after`` s when the first list fails)."""

    def __init__(
        self,
        make: Callable[[], Informer],
        max_stale: float = 30.0,
        retry_after: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._make = make
        self.max_stale = max_stale
        self.retry_after = retry_after
        self._clock = clock
        self.informer: Informer | None = None
        self._lock = asyncio.Lock()
        self._failed_at: float | None = None

    async def ensure_started(self) -> None:
        """Start the informer if it is not running; never raises (the failure is logged)."""
        if self.informer is not None and self.informer.synced:
            return
        async with self._lock:
            if self.informer is not None and self.informer.synced:
                return
            if self._failed_at is not None and self._clock() - self._failed_at < self.retry_after:
                return
            informer = self._make()
            try:
                await informer.start()
            except Exception as err:
                self._failed_at = self._clock()
                log.error(
                    "cannot read GPU nodes and pods from the API server (%s); the spawn form shows "
                    "availability as unknown until this works; retrying in %.0f s. The hub's service "
                    "account needs list and watch on nodes and on pods in all namespaces.",
                    err,
                    self.retry_after,
                )
                return
            self._failed_at = None
            self.informer = informer

    def __call__(self) -> Ledger | None:
        informer = self.informer
        if informer is None or not informer.synced or informer.stale_for() > self.max_stale:
            return None
        return informer.ledger
