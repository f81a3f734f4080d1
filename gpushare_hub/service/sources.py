"""The service's data sources: what its handlers read, kept current by two watchers.

- :class:`~gpushare_hub.kube.informer.LedgerInformer` (the extender's and the spawner's
  watch code) keeps the core ledger (annotations and our DRA driver's ResourceClaims), through
  :class:`~gpushare_hub.kube.ledger_source.SharedLedger` (trusted only while fresh). It hears
  only of the pods that can hold or wait for a slice
  (:func:`~gpushare_hub.core.report.may_hold_slice`; :func:`service_informer`), and
  :class:`Cluster`, its subscriber, keeps of those and of the GPU nodes only the few facts the
  dashboard shows beside the ledger (:class:`~gpushare_hub.core.report.PodFacts`,
  :class:`~gpushare_hub.core.report.NodeFacts`); the report is made from both
  (:func:`~gpushare_hub.core.report.report_from_ledger`), as ``kubectl inspect gpushare``
  makes it from a list;
- :class:`HubServers` polls the hub's REST API (``GET /hub/api/users?state=active``) with the
  service's own token for each server's start and last activity and each user's groups.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Hashable
from functools import partial
from typing import Any

from gpushare_hub.core import Ledger, NodeObject, PodObject, ResourceNames
from gpushare_hub.core.claims import ClaimObject
from gpushare_hub.core.releases import ReleaseHistory
from gpushare_hub.core.report import report_from_ledger
from gpushare_hub.core.reportfacts import (
    NodeFacts,
    PendingPod,
    PodFacts,
    may_hold_slice,
    node_facts,
    pod_facts,
)
from gpushare_hub.core.reportrows import Report
from gpushare_hub.kube.ledger_source import Informer, SharedLedger

from .hubapi import HubAPI
from .hubservers import HubServer, servers_from_users

log = logging.getLogger("gpushare.service")
# How long one api/v1/me computation serves every caller, unless the cluster changed before.
ME_CACHE_SECONDS = 2.0


def service_informer(api: Any, names: ResourceNames, releases: ReleaseHistory | None = None) -> Any:
    """The service's informer: it hears only of the pods that can hold or wait for a slice
    (the ledger still reads every pod event, so no allocation is missed). ``releases``: where
    ended allocations are recorded, for the waiting spawns' estimates."""
    from gpushare_hub.kube.informer import LedgerInformer

    return LedgerInformer(api, names, keep_pod=partial(may_hold_slice, names=names), releases=releases)


class Cluster:
    """The informer's ledger and, beside it, the facts the report needs (module docstring)."""

    def __init__(
        self,
        make_informer: Callable[[], Any],
        names: ResourceNames,
        max_stale: float,
        hub_namespaces: Collection[str] | None = None,
    ) -> None:
        self.names = names
        self.hub_namespaces = hub_namespaces
        self.nodes: dict[str, NodeFacts] = {}  # GPU nodes, and nodes whose inventory is unreadable
        self.pods: dict[str, PodFacts] = {}  # active pods that ask for a GPU
        self._make = make_informer
        self._ledger = Ledger(names)  # the last subscribed informer's (empty before the first)
        self.shared = SharedLedger(self._subscribed, max_stale)
        self._version = 0  # bumped on every event told (claims of ours only): the report is rebuilt
        self._report: tuple[int, Report] | None = None
        self._recent: dict[Hashable, tuple[int, float, Any]] = {}

    def _subscribed(self) -> Informer:
        informer = self._make()
        self.nodes.clear()
        self.pods.clear()
        self._ledger = informer.ledger
        self._version += 1
        informer.on_node(self._on_node)
        informer.on_pod(self._on_pod)
        informer.on_claim(self._on_claim)
        return informer  # type: ignore[no-any-return]

    def _on_node(self, etype: str, obj: NodeObject) -> None:
        self._version += 1
        facts = node_facts(obj, self.names)
        if etype != "DELETED" and (facts.offers_gpu_memory or self._ledger.node(facts.name) is not None):
            self.nodes[facts.name] = facts
        else:
            self.nodes.pop(facts.name, None)

    def _on_pod(self, etype: str, obj: PodObject) -> None:
        self._version += 1
        facts = None if etype == "DELETED" else pod_facts(obj, self.names, self.hub_namespaces)
        if facts is not None:
            self.pods[facts.key] = facts
        else:
            self.pods.pop(obj.key, None)

    def _on_claim(self, etype: str, obj: ClaimObject) -> None:
        """A ResourceClaim event: what the ledger counts for a DRA pod may have changed, and the
        facts kept of the pod stay as they are; the report and api/v1/me are made again."""
        self._version += 1

    def pending(self) -> dict[str, PendingPod]:
        """The GPU pods on no node yet, by ``namespace/name`` (for the metrics)."""
        return {key: f.pending for key, f in self.pods.items() if f.pending is not None}

    def ledger(self) -> Ledger | None:
        return self.shared()

    def report(self) -> Report:
        if self._report is None or self._report[0] != self._version:
            report = report_from_ledger(self._ledger, self.nodes.values(), self.pods.values())
            self._report = (self._version, report)
        return self._report[1]

    def recent(self, key: Hashable, make: Callable[[], Any], ttl: float = ME_CACHE_SECONDS) -> Any:
        """What ``make`` returned for ``key`` less than ``ttl`` seconds ago and before no cluster
        event since; else ``make()`` now. Every notebook server asks ``api/v1/me`` every few
        seconds (the status bar): one document serves them all."""
        now = time.monotonic()
        hit = self._recent.get(key)
        if hit is not None and hit[0] == self._version and now - hit[1] < ttl:
            return hit[2]
        value = make()
        if len(self._recent) > 1000:
            self._recent.clear()
        self._recent[key] = (self._version, now, value)
        return value

    def stale_for(self) -> float:
        informer = self.shared.informer
        return informer.stale_for() if informer is not None else float("inf")


class HubServers:
    """The hub's active servers and users' groups, polled with the service's token."""

    # A server that started since the last read shows no start or activity; a page or API call
    # that meets one asks for a read at once, at most this often (seconds).
    soonest = 1.0

    def __init__(self, api_url: str, token: str) -> None:
        self.api_url = api_url
        self.token = token
        self.servers: list[HubServer] = []
        self.groups: dict[str, list[str]] = {}
        self.error = ""
        self._last_read = float("-inf")  # monotonic time of the last read's start
        self._reading: asyncio.Task[None] | None = None
        self._inactive_groups: dict[str, tuple[float, list[str]]] = {}

    # How long the groups of a user with no active server, read for api/v1/me, are believed.
    groups_ttl = 60.0

    async def groups_of(self, user: str) -> list[str]:
        """``user``'s hub groups: from the last poll when they have an active server, else read
        from the hub (kept :attr:`groups_ttl` seconds; none when the hub cannot say)."""
        if user in self.groups:
            return self.groups[user]
        now = time.monotonic()
        hit = self._inactive_groups.get(user)
        if hit is not None and now - hit[0] < self.groups_ttl:
            return hit[1]
        try:
            status, model = await HubAPI(self.api_url, self.token).user(user)
        except Exception as err:
            log.warning("cannot read %s's groups from the hub: %s", user, err)
            return hit[1] if hit is not None else []
        groups = (
            [str(g) for g in model.get("groups") or []] if status == 200 and isinstance(model, dict) else []
        )
        if len(self._inactive_groups) > 5000:
            self._inactive_groups.clear()
        self._inactive_groups[user] = (now, groups)
        return groups

    def read_soon(self, holders: Collection[tuple[str, str]]) -> None:
        """Read the hub again now if it has not named one of ``holders`` ((user, server) pairs
        holding slices) and no read started in the last :attr:`soonest` seconds or is running."""
        known = {(s.user, s.server) for s in self.servers}
        if all(h in known for h in holders):
            return
        if self._reading is not None and not self._reading.done():
            return
        if time.monotonic() - self._last_read < self.soonest:
            return
        self._reading = asyncio.get_running_loop().create_task(self.poll())

    async def poll(self) -> None:
        self._last_read = time.monotonic()
        try:
            users = await HubAPI(self.api_url, self.token).active_users()
        except Exception as err:  # the hub restarting, a bad answer: keep the last known servers
            self.error = f"cannot read the hub's users: {err}"
            log.warning("%s", self.error)
            return
        self.servers, self.groups = servers_from_users(users)
        self.error = ""
