"""The plugin's usage loop: read the cards' processes, map them to pods, publish, warn once.

Every ``--usage-interval`` seconds: the backend's processes and the node's pods become a
:class:`~gpushare_hub.isolation.usage.UsageReport` (memory and SM utilisation per pod, and since
when each pod has been idle on the GPU), which goes to the Node
(``gpushare-hub.io/usage``, and ``gpushare-hub.io/mps-servers`` on MPS nodes; written only
when it changed by more than jitter), to Prometheus (read at scrape time), and, for a pod over its slice on a
card, to one Warning event (``GPUShareOverSlice``) per pod and card.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import replace
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare_hub.core.names import MPS_SERVERS_ANNOTATION, OVER_SLICE_REASON, USAGE_ANNOTATION
from gpushare_hub.core.usage import read_usage
from gpushare_hub.isolation.usage import IDLE_MEMORY_MIB, UsageReport, is_active, usage_report

from .state import PluginState

log = logging.getLogger("gpushare.plugin")
MIB = 1024 * 1024
# Memory in use jitters: the Node is rewritten (and every watcher of Nodes woken) only when a
# figure moved by this much, or pods, slices, over-slice or idle states or MPS servers changed.
WRITE_TOLERANCE_MIB = 64


class UsageSink(Protocol):
    """Where the report goes (the API server)."""

    def annotate_node(self, node: str, annotations: dict[str, str | None]) -> None: ...

    def node_annotation(self, node: str, key: str) -> str | None:
        """What the Node carries under ``key`` now (an earlier run of the plugin wrote it)."""

    def warn_pod(self, namespace: str, name: str, uid: str, card: str, reason: str, message: str) -> None:
        """One Warning per pod, card and reason: a no-op where an earlier plugin run wrote it."""


class UsageReporter:
    """``idle_memory_mib``: a pod holding no more than this and doing no work is idle on the GPU.
    Since when is kept per pod and card and published; a restarted plugin goes on from what the
    Node shows, so an idle clock survives restarts."""

    def __init__(
        self,
        state: PluginState,
        sink: UsageSink,
        mps: bool,
        idle_memory_mib: int = IDLE_MEMORY_MIB,
        clock: Callable[[], float] = time.time,
        claimed: Callable[[], Mapping[str, tuple[str, dict[str, int]]]] | None = None,
    ) -> None:
        """``claimed``: on a DRA node, the slices of the claims its plugin prepared (pod UID ->
        (namespace/name, {card UUID: MiB})); the pods' annotations give the others."""
        self.claimed = claimed
        self.state = state
        self.sink = sink
        self.mps = mps
        self.idle_memory_mib = idle_memory_mib
        self.clock = clock
        self.latest: UsageReport | None = None
        # The latest reading as measured (before any slice is reported as 0) and when it began.
        self.reading: tuple[UsageReport, float] | None = None
        # Overcommit: (pod UID, card) of pods reported over their slice with 0 allowed (they use
        # the GPU while recorded hibernated and the card has no room: core/arbiter.py).
        self.zero_slices: Callable[[], Collection[tuple[str, str]]] | None = None
        self._poke = threading.Event()
        self._published: UsageReport | None = None  # what the Node shows
        self._warned: set[tuple[str, str]] = set()  # (pod UID, card)
        self._idle_since: dict[tuple[str, str], int] | None = None  # (pod UID, card) -> Unix seconds

    def _restore(self, node: str) -> dict[tuple[str, str], int]:
        """The idle clocks an earlier run of this plugin published (none when it cannot be read)."""
        try:
            usage = read_usage(self.sink.node_annotation(node, USAGE_ANNOTATION))
        except Exception as err:
            log.warning("cannot read the usage this node published before (%s); idle clocks start now", err)
            return {}
        if usage is None:
            return {}
        return {
            (use.uid, card): use.idle_since
            for (_pod, card), use in usage.pods.items()
            if use.uid and use.idle_since is not None
        }

    def _with_idle(self, report: UsageReport) -> UsageReport:
        """Each pod's idle clock: started at the first reading that finds it idle, cleared by
        any reading that finds it active, unknown where utilisation is not measured."""
        assert self._idle_since is not None
        now = int(self.clock())
        rows = []
        kept: dict[tuple[str, str], int] = {}
        for p in report.pods:
            active = is_active(p.used_mib, p.sm_util, self.idle_memory_mib)
            since = None
            if active is False:
                # A clock from the future (a node clock set back) starts again now.
                since = min(self._idle_since.get((p.uid, p.card), now), now)
                kept[(p.uid, p.card)] = since
            rows.append(replace(p, idle_since=since))
        self._idle_since = kept
        return replace(report, pods=tuple(rows))

    def poll(self) -> UsageReport:
        node = self.state.settings.node
        if self._idle_since is None:
            self._idle_since = self._restore(node)
        backend = self.state.backend
        began = self.clock()
        report = usage_report(
            backend.processes(),
            self.state.pods.pods_on_node(node),
            self.state.ledger_node(),
            self.state.settings.names,
            unsampled=backend.unsampled_cards(),
            claimed=self.claimed() if self.claimed else None,
        )
        report = self._with_idle(report)
        self.reading = (report, began)
        zero = set(self.zero_slices()) if self.zero_slices else set()
        if zero:
            rows = tuple(replace(p, slice_mib=0) if (p.uid, p.card) in zero else p for p in report.pods)
            report = replace(report, pods=rows)
        self.latest = report
        if report.differs(self._published, WRITE_TOLERANCE_MIB):
            annotations = {
                USAGE_ANNOTATION: report.annotation(),
                MPS_SERVERS_ANNOTATION: report.mps_annotation() if self.mps else None,
            }
            self.sink.annotate_node(node, annotations)
            self._published = report
        for p in report.over():
            if (p.uid, p.card) in self._warned:
                continue
            namespace, name = p.pod.split("/", 1)
            message = p.warning(node)
            log.warning(message)
            self.sink.warn_pod(namespace, name, p.uid, p.card, OVER_SLICE_REASON, message)
            self._warned.add((p.uid, p.card))
        self._warned &= {(p.uid, p.card) for p in report.pods}  # forget pods that are gone
        return report

    def poke(self) -> None:
        """Read again now rather than at the end of the interval (the hibernation keeper waits
        for a measurement)."""
        self._poke.set()

    def run(self, stop: threading.Event, interval: float) -> None:
        while not stop.is_set():
            try:
                self.poll()
            except Exception as err:
                log.warning("reading GPU memory usage failed: %s; retrying in %.0f s", err, interval)
            until = time.monotonic() + interval
            while not stop.is_set() and not self._poke.is_set() and time.monotonic() < until:
                stop.wait(min(0.5, max(0.0, until - time.monotonic())))
            self._poke.clear()


class UsageCollector(Collector):
    """Prometheus metrics from the latest report, computed at scrape time."""

    def __init__(self, reporter: UsageReporter) -> None:
        self.reporter = reporter

    def collect(self) -> Iterator[Metric]:
        r = self.reporter.latest
        now = int(self.reporter.clock())
        used = GaugeMetricFamily(
            "gpushare_pod_gpu_memory_used_bytes",
            "GPU memory the pod's processes hold on the card (NVML)",
            labels=["namespace", "pod", "card"],
        )
        held = GaugeMetricFamily(
            "gpushare_pod_gpu_memory_slice_bytes",
            "The pod's slice of the card",
            labels=["namespace", "pod", "card"],
        )
        card = GaugeMetricFamily(
            "gpushare_card_gpu_memory_used_bytes",
            "GPU memory held by every process on the card, pods or not",
            labels=["card"],
        )
        util = GaugeMetricFamily(
            "gpushare_pod_gpu_utilization_ratio",
            "Share of the card's SMs the pod's processes kept busy since the previous reading (NVML)",
            labels=["namespace", "pod", "card"],
        )
        idle = GaugeMetricFamily(
            "gpushare_pod_gpu_idle_seconds",
            "How long the pod has done no GPU work and held no more than --idle-memory-mib (0: active)",
            labels=["namespace", "pod", "card"],
        )
        over = GaugeMetricFamily("gpushare_pods_over_slice", "Pods using more than their slice on a card")
        mps = GaugeMetricFamily(
            "gpushare_card_mps_server_uid", "UID the card's MPS server runs for", labels=["card"]
        )
        if r is not None:
            for p in r.pods:
                namespace, name = p.pod.split("/", 1)
                used.add_metric([namespace, name, p.card], p.used_mib * MIB)
                held.add_metric([namespace, name, p.card], p.slice_mib * MIB)
                if p.sm_util is not None:
                    util.add_metric([namespace, name, p.card], p.sm_util / 100)
                    since = p.idle_since
                    idle.add_metric([namespace, name, p.card], 0 if since is None else max(0, now - since))
            for uuid, mib in sorted(r.card_used_mib.items()):
                card.add_metric([uuid], mib * MIB)
            over.add_metric([], len(r.over()))
            for uuid, uid in sorted(r.mps_servers.items()):
                mps.add_metric([uuid], uid)
        yield from (used, held, util, idle, card, over, mps)
