"""The extender's state: the ledger kept current from the API server, and the bind flow.

Start-up lists Nodes and Pods, builds the ledger, then watches both; ``ready``
turns true only after the first full list, so a restarted extender never answers
from an empty ledger. A watch that expires resumes from its last resource
version; one that is too old (HTTP 410) lists again and rebuilds the ledger,
keeping placements whose bind is still in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpushare_hub.core import (
    ALLOCATION_ANNOTATION,
    DEFAULT_NAMES,
    GPUShareError,
    Ignored,
    IgnoredRecord,
    Ledger,
    Placement,
    ResourceNames,
    demand_from_pod,
    pod_key,
)
from gpushare_hub.core.mps import MISMATCH_REASON, NodeMPS, node_mps, uid_mismatches

from .decisions import Decisions
from .kube import Kube, sleep_backoff
from .leader import LeaseElector
from .wire import BindingArgs

log = logging.getLogger("gpushare.extender")

BYPASS_REASON = "GPUShareNotScheduled"
IGNORED_REASON = "GPUShareAllocationIgnored"


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


class ExtenderService:
    def __init__(
        self,
        kube: Kube | None,
        policy: str = "binpack",
        names: ResourceNames = DEFAULT_NAMES,
        scheduler_name: str = "gpushare-scheduler",
        warn_bypass: bool = True,
    ) -> None:
        self.kube = kube
        self.names = names
        self.policy = policy
        self.scheduler_name = scheduler_name
        self.warn_bypass = warn_bypass
        self.decisions = Decisions(Ledger(names), policy, names)
        self.metrics = Metrics()
        self.metrics.watch_ledger(lambda: self.ledger)
        self.ready = False
        self.elector: LeaseElector | None = None  # with --leader-elect: bind only while leading
        self._tasks: list[asyncio.Task[None]] = []
        self._events: set[asyncio.Task[None]] = set()  # Warning events being written
        self._warned: set[str] = set()
        self._mps: dict[str, NodeMPS] = {}  # nodes whose plugin runs MPS: each card's server UID
        self._reported: set[tuple[str, Ignored]] = set()  # (pod UID, reason) of ignored records reported
        self._node_rv = self._pod_rv = ""
        # Pods as the scheduler sent them to filter, by UID, so that bind (which gets
        # names only) need not read them again. Bounded; a miss just reads the pod.
        self._recent: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def remember(self, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid")
        if uid:
            self._recent[uid] = pod
            self._recent.move_to_end(uid)
            while len(self._recent) > 4096:
                self._recent.popitem(last=False)

    @property
    def ledger(self) -> Ledger:
        return self.decisions.ledger

    # ---- syncing with the API server ------------------------------------------------
    async def start(self) -> None:
        await self.resync()
        self._tasks = [
            asyncio.create_task(self._watch_loop("nodes")),
            asyncio.create_task(self._watch_loop("pods")),
        ]
        self.ready = True

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.kube is not None:
            await self.kube.close()

    async def resync(self) -> None:
        """List everything and rebuild the ledger, keeping binds still in flight."""
        assert self.kube is not None
        nodes, self._node_rv = await self.kube.list_nodes()
        pods, self._pod_rv = await self.kube.list_pods()
        old = self.ledger
        fresh = Ledger(self.names)
        for obj in nodes:
            self._observe_node(fresh, obj)
        for pod in pods:
            self._observe_pod(fresh, pod)
        for alloc in old.allocations():
            if alloc.assumed and fresh.allocation(alloc.key) is None:
                with contextlib.suppress(GPUShareError):
                    fresh.commit(Placement(alloc.key, alloc.node, alloc.cards, alloc.containers, alloc.uid))
        self.decisions = Decisions(fresh, self.policy, self.names)
        log.info(
            "ledger rebuilt from the API server: %d GPU nodes, %d pods holding slices",
            len(fresh.node_names),
            len(fresh.allocations()),
        )

    def _observe_node(self, ledger: Ledger, obj: dict[str, Any], deleted: bool = False) -> None:
        name = (obj.get("metadata") or {}).get("name", "?")
        mps = NodeMPS() if deleted else node_mps(obj)
        if mps.enabled:
            self._mps[name] = mps
        else:
            self._mps.pop(name, None)
        try:
            if deleted:
                ledger.remove_node(name)
            else:
                for ignored in ledger.observe_node(obj):
                    self._report_ignored(ignored)
        except GPUShareError as err:
            log.warning("ignoring node %s: %s", name, err)

    def _observe_pod(self, ledger: Ledger, obj: dict[str, Any], deleted: bool = False) -> None:
        try:
            ignored = ledger.observe_pod(obj, deleted=deleted)
        except GPUShareError as err:
            log.warning("ignoring pod %s: %s", pod_key(obj), err)
        else:
            if ignored is not None:
                self._report_ignored(ignored)
        if deleted:
            uid = str((obj.get("metadata") or {}).get("uid", ""))
            self._warned.discard(uid)
            self._reported = {r for r in self._reported if r[0] != uid}
        elif self.warn_bypass:
            self._check_bypass(ledger, obj)

    def _report_ignored(self, ignored: IgnoredRecord) -> None:
        """A record the ledger refused: a metric, a log line and a Warning event on the pod, once."""
        if (ignored.uid, ignored.reason) in self._reported:
            return
        self._reported.add((ignored.uid, ignored.reason))
        self.metrics.ignored.labels(ignored.reason.value).inc()
        message = ignored.message()
        log.warning("%s", message)
        if self.kube is None:
            return
        namespace, name = ignored.key.split("/", 1)
        pod = {"metadata": {"name": name, "namespace": namespace, "uid": ignored.uid}}
        task = asyncio.get_running_loop().create_task(self.kube.warn(pod, IGNORED_REASON, message))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    def _check_bypass(self, ledger: Ledger, pod: dict[str, Any]) -> None:
        """A pod that asks for our resource but got a node without our choice of card."""
        # Cheap questions first: this runs on every pod event of the cluster.
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        node = spec.get("nodeName")
        if self.kube is None or not node or ledger.node(node) is None:
            return
        if ALLOCATION_ANNOTATION in (meta.get("annotations") or {}):
            return
        uid = str(meta.get("uid", ""))
        if uid in self._warned or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        try:
            demand = demand_from_pod(pod, self.names)
        except GPUShareError:
            return
        if demand is None:
            return
        self._warned.add(uid)
        scheduler = spec.get("schedulerName") or "default-scheduler"
        message = (
            f"pod {demand.key} asks for {self.names.memory} but was placed on {spec['nodeName']} by "
            f"{scheduler!r}, not by {self.scheduler_name!r}, so no card was chosen for it and the device "
            f"plugin cannot give it one. Set spec.schedulerName: {self.scheduler_name} (GPUShareSpawner "
            "does this) and recreate the pod."
        )
        log.warning(message)
        task = asyncio.get_running_loop().create_task(self.kube.warn(pod, BYPASS_REASON, message))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    async def _watch_loop(self, kind: str) -> None:
        assert self.kube is not None
        attempt = 0
        while True:
            rv = self._node_rv if kind == "nodes" else self._pod_rv
            try:
                await self.kube.watch(kind, rv, lambda t, o: self._on_event(kind, t, o))
                attempt = 0
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                if err.status == 410:
                    log.info("%s watch expired (resource version too old): listing again", kind)
                    await self.resync()
                else:
                    log.warning("%s watch failed: %s; retrying", kind, err.reason)
                    await sleep_backoff(attempt)
                    attempt += 1
            except Exception as err:  # connection reset, API server restart, ...
                log.warning("%s watch broke: %s; retrying", kind, err)
                await sleep_backoff(attempt)
                attempt += 1

    def _on_event(self, kind: str, etype: str, obj: dict[str, Any]) -> None:
        rv = (obj.get("metadata") or {}).get("resourceVersion", "")
        if etype == "BOOKMARK":
            if kind == "nodes":
                self._node_rv = rv or self._node_rv
            else:
                self._pod_rv = rv or self._pod_rv
            return
        deleted = etype == "DELETED"
        if kind == "nodes":
            self._node_rv = rv or self._node_rv
            self._observe_node(self.ledger, obj, deleted)
        else:
            self._pod_rv = rv or self._pod_rv
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "pod %s %s rv=%s node=%s",
                    etype,
                    pod_key(obj),
                    rv,
                    (obj.get("spec") or {}).get("nodeName"),
                )
            self._observe_pod(self.ledger, obj, deleted)

    # ---- bind ----------------------------------------------------------------------------
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
        """Choose the card and bind; returns "" or the error for ExtenderBindingResult.Error.

        The card choice is recorded in the ledger before the first await, so that
        concurrent binds see it. The annotations travel inside the Binding, which
        the API server applies atomically: either the pod is bound with its card
        written on it, or nothing changed and the ledger entry is dropped again.
        """
        refusal = self._bind_refusal(args)
        if refusal:
            return refusal
        assert self.kube is not None
        key = f"{args.pod_namespace}/{args.pod_name}"
        pod = self._recent.pop(args.pod_uid, None) if args.pod_uid else None
        if pod is None or pod_key(pod) != key:
            try:
                pod = await self.kube.get_pod(args.pod_namespace, args.pod_name)
            except ApiException as err:
                return f"pod {key}: cannot read it before binding ({err.status} {err.reason})"
        uid = (pod.get("metadata") or {}).get("uid", "")
        if args.pod_uid and uid != args.pod_uid:
            return f"pod {key} was replaced (uid {uid}, scheduler asked for {args.pod_uid}); not binding"
        if (pod.get("spec") or {}).get("nodeName"):
            return f"pod {key} is already bound to {pod['spec']['nodeName']}"
        try:
            decision = self.decisions.bind(pod, args.node)
        except GPUShareError as err:
            return str(err)
        annotations: dict[str, str] = {}
        if decision is not None:
            if not isinstance(decision, Placement):
                return decision.reason
            annotations = decision.record().pod_annotations(
                self.decisions.card_units(decision), time.time_ns()
            )
        try:
            await self.kube.bind(
                args.pod_namespace, args.pod_name, args.pod_uid or uid, args.node, annotations
            )
        except ApiException as err:
            if decision is not None:
                self.ledger.release(key)
            return f"binding pod {key} to {args.node} failed: {err.status} {err.reason}"
        except BaseException:
            if decision is not None:
                self.ledger.release(key)
            raise
        if isinstance(decision, Placement):
            self.metrics.placements.labels(decision.policy).inc()
            cards = ", ".join(f"card {c.index} ({c.uuid}) {self.names.fmt(c.units)}" for c in decision.cards)
            log.info("placed pod %s on node %s, %s, policy %s", key, args.node, cards, decision.policy)
            self._warn_mps_users(pod, decision)
        return ""

    def _warn_mps_users(self, pod: dict[str, Any], placement: Placement) -> None:
        """A pod of another UID than a card's MPS server would hang silently: say so on the pod."""
        mps = self._mps.get(placement.node)
        if mps is None or self.kube is None:
            return
        for clash in uid_mismatches(mps, placement.node, pod, [c.uuid for c in placement.cards]):
            log.warning(clash.message())
            task = asyncio.get_running_loop().create_task(
                self.kube.warn(pod, MISMATCH_REASON, clash.message())
            )
            self._events.add(task)
            task.add_done_callback(self._events.discard)
