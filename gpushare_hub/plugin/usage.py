"""The plugin's usage loop: read the cards' processes, map them to pods, publish, warn once.

Every ``--usage-interval`` seconds: the backend's processes and the node's pods become a
:class:`~gpushare_hub.isolation.usage.UsageReport`, which goes to the Node
(``gpushare-hub.io/usage``, and ``gpushare-hub.io/mps-servers`` on MPS nodes; written only
when it changed by more than jitter), to Prometheus (read at scrape time), and, for a pod over its slice on a
card, to one Warning event (``GPUShareOverSlice``) per pod and card.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare_hub.core.cards import Node
from gpushare_hub.core.names import MPS_SERVERS_ANNOTATION, OVER_SLICE_REASON, USAGE_ANNOTATION
from gpushare_hub.isolation.usage import UsageReport, usage_report

from .state import PluginState

log = logging.getLogger("gpushare.plugin")
MIB = 1024 * 1024
# Memory in use jitters: the Node is rewritten (and every watcher of Nodes woken) only when a
# figure moved by this much, or pods, slices, over-slice states or MPS servers changed.
WRITE_TOLERANCE_MIB = 64


class UsageSink(Protocol):
    """Where the report goes (the API server)."""

    def annotate_node(self, node: str, annotations: dict[str, str | None]) -> None: ...

    def warn_pod(self, namespace: str, name: str, uid: str, card: str, reason: str, message: str) -> None:
        """One Warning per pod, card and reason: a no-op where an earlier plugin run wrote it."""


class UsageReporter:
    def __init__(self, state: PluginState, sink: UsageSink, mps: bool) -> None:
        self.state = state
        self.sink = sink
        self.mps = mps
        self.latest: UsageReport | None = None
        self._published: UsageReport | None = None  # what the Node shows
        self._warned: set[tuple[str, str]] = set()  # (pod UID, card)

    def poll(self) -> UsageReport:
        node = self.state.settings.node
        report = usage_report(
            self.state.backend.processes(),
            self.state.pods.pods_on_node(node),
            Node(node, tuple(self.state.inventory())),
            self.state.settings.names,
        )
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

    def run(self, stop: threading.Event, interval: float) -> None:
        while not stop.is_set():
            try:
                self.poll()
            except Exception as err:
                log.warning("reading GPU memory usage failed: %s; retrying in %.0f s", err, interval)
            stop.wait(interval)


class UsageCollector(Collector):
    """Prometheus metrics from the latest report, computed at scrape time."""

    def __init__(self, reporter: UsageReporter) -> None:
        self.reporter = reporter

    def collect(self) -> Iterator[Metric]:
        r = self.reporter.latest
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
        over = GaugeMetricFamily("gpushare_pods_over_slice", "Pods using more than their slice on a card")
        mps = GaugeMetricFamily(
            "gpushare_card_mps_server_uid", "UID the card's MPS server runs for", labels=["card"]
        )
        if r is not None:
            for p in r.pods:
                namespace, name = p.pod.split("/", 1)
                used.add_metric([namespace, name, p.card], p.used_mib * MIB)
                held.add_metric([namespace, name, p.card], p.slice_mib * MIB)
            for uuid, mib in sorted(r.card_used_mib.items()):
                card.add_metric([uuid], mib * MIB)
            over.add_metric([], len(r.over()))
            for uuid, uid in sorted(r.mps_servers.items()):
                mps.add_metric([uuid], uid)
        yield from (used, held, card, over, mps)
