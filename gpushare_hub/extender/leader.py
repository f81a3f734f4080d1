"""A Lease held by one extender replica, so that only one binds (``--leader-elect``).

Two replicas that both answer (a Deployment behind a Service) keep two ledgers;
each would bind against its own and together they could over-commit a card. With
``--leader-elect`` each replica competes for a ``coordination.k8s.io/v1`` Lease:
the holder binds, the others answer filter and prioritize from their warm ledgers
but refuse bind with an error that names the leader, so kube-scheduler retries the
pod (through the Service, on the leader sooner or later).

The usual rules of Kubernetes leader election: a holder renews every
``retry_period``; it stops binding once ``renew_deadline`` passed without a
successful renewal; another replica takes the Lease only after
``lease_duration`` without a renewal, and lists the cluster again before binding
so that its ledger holds the old leader's last binds. Updates go through the
Lease's resourceVersion, so two replicas never both win.

Not needed for the sidecar set-up (the extender beside each scheduler replica, at
``127.0.0.1``): there kube-scheduler's own leader election picks the replica.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger("gpushare.extender")


@dataclass(frozen=True)
class LeaseSettings:
    name: str = "gpushare-extender"
    namespace: str = "kube-system"
    identity: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def _now() -> str:
    """MicroTime as the API server writes it (always six fractional digits)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _micro(value: dt.datetime | None) -> str | None:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if value else None


class LeaseElector:
    """Keeps trying to hold the Lease; :attr:`leader` says whether this replica may bind now."""

    def __init__(
        self,
        api: client.ApiClient,
        settings: LeaseSettings,
        on_elected: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.api = client.CoordinationV1Api(api)
        self.settings = settings
        self.on_elected = on_elected
        self.holder = ""  # who holds it, as last read
        self._renewed = 0.0  # monotonic time of our last successful acquire/renew
        self._elected = False

    @property
    def leader(self) -> bool:
        return self._elected and time.monotonic() - self._renewed < self.settings.renew_deadline

    def refusal(self) -> str:
        """The bind error of a replica that does not hold the Lease."""
        s = self.settings
        who = f"replica {self.holder}" if self.holder and self.holder != s.identity else "no replica yet"
        return (
            f"this extender replica ({s.identity}) does not hold the Lease {s.namespace}/{s.name} "
            f"({who} does), so it does not bind: two replicas binding at once could over-commit a card. "
            "kube-scheduler retries the pod; point it at the leader, or run the extender as a sidecar of "
            "each scheduler replica without --leader-elect"
        )

    async def run(self) -> None:
        while True:
            try:
                await self._try_once()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("lease %s/%s: %s", self.settings.namespace, self.settings.name, err)
            await asyncio.sleep(self.settings.retry_period)

    def _body(self, acquire: str | None, transitions: int, resource_version: str = "") -> Any:
        s = self.settings
        meta: dict[str, Any] = {"name": s.name, "namespace": s.namespace}
        if resource_version:
            meta["resourceVersion"] = resource_version  # lost races answer 409
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": s.identity,
                "leaseDurationSeconds": max(1, int(s.lease_duration)),
                "acquireTime": acquire or _now(),
                "renewTime": _now(),
                "leaseTransitions": transitions,
            },
        }

    async def _try_once(self) -> None:
        s = self.settings
        started = time.monotonic()
        try:
            lease = await self.api.read_namespaced_lease(s.name, s.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            lease = None
        if lease is None:
            try:
                await self.api.create_namespaced_lease(s.namespace, self._body(None, 0))
            except ApiException as err:
                if err.status == 409:  # another replica created it first
                    return
                raise
            await self._won(started)
            return
        spec = lease.spec or client.V1LeaseSpec()
        self.holder = str(spec.holder_identity or "")
        ours = self.holder == s.identity
        renewed = spec.renew_time.timestamp() if spec.renew_time else 0.0
        expired = time.time() - renewed > float(spec.lease_duration_seconds or s.lease_duration)
        if not ours and not expired:
            if self._elected:
                log.warning("lost the lease %s/%s to %s; not binding", s.namespace, s.name, self.holder)
            self._elected = False
            return
        transitions = int(spec.lease_transitions or 0) + (0 if ours else 1)
        body = self._body(
            _micro(spec.acquire_time) if ours else None, transitions, lease.metadata.resource_version
        )
        try:
            await self.api.replace_namespaced_lease(s.name, s.namespace, body)
        except ApiException as err:
            if err.status == 409:  # someone else updated it in between
                self._elected = False
                return
            raise
        await self._won(started)

    async def _won(self, started: float) -> None:
        s = self.settings
        if not self._elected:
            log.info("holding the lease %s/%s as %s: binding from now on", s.namespace, s.name, s.identity)
            if self.on_elected is not None:
                await self.on_elected()  # e.g. list again, to see the previous leader's last binds
        self.holder = s.identity
        self._renewed = started
        self._elected = True
