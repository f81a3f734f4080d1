"""The extender's parts glued together: the informer that keeps the ledger, the decisions
on it, the binder, the bypass warnings and the metrics.

``ready`` turns true only after the informer's first full list, so a restarted
extender never answers from an empty ledger, and turns false while a watch has
been failing for longer than ``stale_after`` seconds (and back once it recovers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpushare_hub.core import (
    DEFAULT_NAMES,
    Ignored,
    IgnoredRecord,
    Ledger,
    NodeObject,
    Placement,
    PodObject,
    ResourceNames,
)
from gpushare_hub.core.claims import ClaimIgnored, ClaimObject, claim_key
from gpushare_hub.core.mps import NodeMPS, node_mps, uid_mismatches
from gpushare_hub.core.names import (
    BYPASS_REASON,
    IGNORED_REASON,
    MPS_MISMATCH_REASON,
    NODE_UNREADABLE_REASON,
)
from gpushare_hub.kube import LedgerInformer

from .binding import Binder, BindResult
from .bypass import BypassWarner
from .decisions import Decisions
from .dratemplates import ClaimTemplates
from .kube import Kube
from .leader import LeaseElector
from .line import LineKeeper
from .wire import BindingArgs

log = logging.getLogger("gpushare.extender")

__all__ = ["BYPASS_REASON", "IGNORED_REASON", "ExtenderService", "Metrics"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "gpushare_extender_requests",
            "Extender requests by verb and outcome",
            ["verb", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "gpushare_extender_request_seconds",
            "Extender request latency by verb",
            ["verb"],
            registry=r,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
        self.placements = Counter(
            "gpushare_extender_placements", "Pods bound to a card, by policy", ["policy"], registry=r
        )
        self.units_used = Gauge("gpushare_ledger_units_used", "GPU-memory units held by pods", registry=r)
        self.units_total = Gauge("gpushare_ledger_units_total", "GPU-memory units on all cards", registry=r)
        self.cards_in_use = Gauge(
            "gpushare_ledger_cards_in_use", "Cards holding at least one slice", registry=r
        )
        self.ignored = Counter(
            "gpushare_ledger_ignored_records",
            "Pod allocation records the ledger refused to count (forged, unbound, over a card), by reason",
            ["reason"],
            registry=r,
        )
        self.binds_refused = Counter(
            "gpushare_extender_binds_refused",
            "Binds refused before any decision: no pod UID, or this replica does not hold the Lease",
            ["reason"],
            registry=r,
        )
        self.overcommitted = Gauge(
            "gpushare_ledger_overcommitted_cards",
            "Cards whose pods' annotations add up to more than the card",
            registry=r,
        )

    def watch_ledger(self, ledger: Callable[[], Ledger]) -> None:
        """Ledger gauges are read when /metrics is scraped, never on the request path."""
        self.units_used.set_function(lambda: ledger().totals()[0])
        self.units_total.set_function(lambda: ledger().totals()[1])
        self.cards_in_use.set_function(lambda: ledger().cards_in_use())
        self.overcommitted.set_function(lambda: len(ledger().overcommitted()))


async def _no_template(namespace: str, name: str) -> None:
    return None


class ExtenderService:
    def __init__(
        self,
        kube: Kube | None,
        policy: str = "binpack",
        names: ResourceNames = DEFAULT_NAMES,
        scheduler_name: str = "gpushare-scheduler",
        warn_bypass: bool = True,
        stale_after: float = 30.0,
        informer: LedgerInformer | None = None,
    ) -> None:
        self.kube = kube
        self.names = names
        self.policy = policy
        self.scheduler_name = scheduler_name
        self.stale_after = stale_after
        self.informer = informer or LedgerInformer(kube.api if kube is not None else None, names)
        self.decisions = Decisions(self.informer.ledger, policy, names)
        self.metrics = Metrics()
        self.metrics.watch_ledger(lambda: self.ledger)
        # The DRA pods' templates (the prioritize-only verb); no API server: none are found.
        self.templates = ClaimTemplates(kube.get_claim_template if kube is not None else _no_template, names)
        self.elector: LeaseElector | None = None  # with --leader-elect: bind only while leading
        self._events: set[asyncio.Task[None]] = set()  # Warning events being written
        self._reported: set[tuple[str, Ignored]] = set()  # (pod UID, reason) of ignored records reported
        self._unreadable_reported: set[tuple[str, str]] = set()  # (node, reason) warned of
        self._mps: dict[str, NodeMPS] = {}  # nodes whose plugin runs MPS: each card's server UID
        self.informer.on_node(self._track_mps)
        self.informer.on_unreadable(self._report_unreadable)
        self.informer.on_ignored(self._report_ignored)
        self.informer.on_pod(self._forget_reported)
        keeper = LineKeeper(self.decisions, scheduler_name)
        self.informer.on_pod(keeper.on_pod)
        self.informer.on_node(keeper.on_node)
        self.informer.on_claim(self._forget_reported)
        self.binder: Binder | None = None
        if kube is not None:
            self.binder = Binder(kube, lambda: self.decisions, names)
            self.informer.protect = self.binder.unresolved
            self.informer.on_pod(self.binder.on_pod)
            if warn_bypass:
                self.informer.on_pod(BypassWarner(kube, self.informer.ledger, names, scheduler_name))

    @property
    def ledger(self) -> Ledger:
        return self.decisions.ledger

    @property
    def ready(self) -> bool:
        """Synced once, and no watch failing for longer than ``stale_after`` seconds."""
        return self.informer.synced and self.informer.stale_for() <= self.stale_after

    @ready.setter
    def ready(self, value: bool) -> None:
        """Tests and benchmarks without an API server mark the ledger as read."""
        self.informer.synced = value

    def remember(self, pod: PodObject) -> None:
        if self.binder is not None:
            self.binder.remember(pod)

    async def start(self) -> None:
        await self.informer.start()

    async def resync(self) -> None:
        """Read the cluster again (on winning the Lease: the previous leader's last binds)."""
        await self.informer.resync()

    async def stop(self) -> None:
        await self.informer.stop()
        if self.binder is not None:
            await self.binder.stop()
        if self.kube is not None:
            await self.kube.close()

    def _report_ignored(self, ignored: IgnoredRecord) -> None:
        """A record the ledger refused: a metric, a log line and a Warning event on the pod, once
        (on the ResourceClaim itself for a claim no pod is reserved for yet)."""
        if (ignored.uid, ignored.reason) in self._reported:
            return
        self._reported.add((ignored.uid, ignored.reason))
        self.metrics.ignored.labels(ignored.reason.value).inc()
        message = ignored.message()
        log.warning("%s", message)
        if self.kube is None:
            return
        task = asyncio.get_running_loop().create_task(self._warn_ignored(self.kube, ignored, message))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    @staticmethod
    async def _warn_ignored(kube: Kube, ignored: IgnoredRecord, message: str) -> None:
        """The Warning event of an ignored record: on its pod; for a claim that holds its units
        under its own key (no pod reserved yet, :func:`~gpushare_hub.core.claims.claim_key`), on
        the ResourceClaim, since no pod of that name exists."""
        if isinstance(ignored, ClaimIgnored):
            namespace, _, name = ignored.claim.partition("/")
            if ignored.key == claim_key(namespace, name):
                await kube.warn_claim(namespace, name, ignored.uid, IGNORED_REASON, message)
                return
        namespace, _, name = ignored.key.partition("/")
        await kube.warn(PodObject(name=name, namespace=namespace, uid=ignored.uid), IGNORED_REASON, message)

    def _report_unreadable(self, node: str, reason: str) -> None:
        """A Node whose card inventory cannot be read: a Warning event on it, once per reason
        (the ledger already took it out of placement and the informer logged why). With leader
        election only the leader writes it, so replicas do not repeat it."""
        if (node, reason) in self._unreadable_reported:
            return
        if self.elector is not None and not self.elector.leader:
            return  # the leader warns; a follower that leads later warns at the node's next event
        self._unreadable_reported.add((node, reason))
        if self.kube is None:
            return
        message = f"{reason}; no slice is placed on node {node} until its inventory can be read"
        task = asyncio.get_running_loop().create_task(
            self.kube.warn_node(node, NODE_UNREADABLE_REASON, message)
        )
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    def _track_mps(self, etype: str, obj: NodeObject) -> None:
        mps = NodeMPS() if etype == "DELETED" else node_mps(obj)
        if mps.enabled:
            self._mps[obj.name] = mps
        else:
            self._mps.pop(obj.name, None)

    def _warn_mps_users(self, pod: PodObject, placement: Placement) -> None:
        """A pod of another UID than a card's MPS server would hang silently: say so on the pod."""
        mps = self._mps.get(placement.node)
        if mps is None or self.kube is None:
            return
        for clash in uid_mismatches(mps, placement.node, pod, [c.uuid for c in placement.cards]):
            log.warning(clash.message())
            task = asyncio.get_running_loop().create_task(
                self.kube.warn(pod, MPS_MISMATCH_REASON, clash.message())
            )
            self._events.add(task)
            task.add_done_callback(self._events.discard)

    def _forget_reported(self, etype: str, obj: PodObject | ClaimObject) -> None:
        """A pod or ResourceClaim gone: what was reported of it may be reported again."""
        if etype == "DELETED" and obj.uid:
            uid = obj.uid
            self._reported = {r for r in self._reported if r[0] != uid}

    def _bind_refusal(self, args: BindingArgs) -> str:
        """Binds this replica must not do: without the pod's UID, or while another replica leads."""
        if not args.pod_uid:
            self.metrics.binds_refused.labels("no-uid").inc()
            return (
                f"bind of pod {args.pod_namespace}/{args.pod_name}: PodUID is missing; the extender binds "
                "only the pod that kube-scheduler scheduled, named by its UID"
            )
        if self.elector is not None and not self.elector.leader:
            self.metrics.binds_refused.labels("not-leader").inc()
            return f"bind of pod {args.pod_namespace}/{args.pod_name}: {self.elector.refusal()}"
        return ""

    async def bind(self, args: BindingArgs) -> str:
        """Bind for kube-scheduler; returns "" or the error for ExtenderBindingResult.Error."""
        refusal = self._bind_refusal(args)
        if refusal:
            return refusal
        if self.binder is None:
            return "the extender runs without an API server; it cannot bind"
        result: BindResult = await self.binder.bind(
            args.pod_namespace, args.pod_name, args.pod_uid, args.node
        )
        if result.placement is not None:
            p = result.placement
            self.metrics.placements.labels(p.policy).inc()
            cards = ", ".join(f"card {c.index} ({c.uuid}) {self.names.fmt(c.units)}" for c in p.cards)
            log.info("placed pod %s on node %s, %s, policy %s", result.pod, p.node, cards, p.policy)
            if result.pod_object is not None:
                self._warn_mps_users(result.pod_object, p)
        return result.error()
