"""Why and how long GPU pods wait for a card, in the fixed words of the metrics: the label of
``gpushare_pending_pods{reason=...}`` for each pending pod (from the placer's own verdicts and
kube-scheduler's message), and the longest wait (``gpushare_pending_longest_seconds``), which the
chart's alert rules read. Pure."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from gpushare_hub.core import Ledger, Placer
from gpushare_hub.core.availability import placer_for
from gpushare_hub.core.reportfacts import PendingPod
from gpushare_hub.core.verdict import Reason

from .hubservers import seconds_of

# ``gpushare_pending_pods{reason=...}``: a fixed set of values (a contract with dashboards and
# alerts), in the order of what a pod most plausibly waits for: the first that applies wins.
# No value names a node or a pod; the scheduler's message, which does, stays whole on the
# dashboard and in api/v1/ledger.
LABELS = (
    "not_scheduled_yet",
    "gpu_memory_full",
    "cpu_or_memory",
    "handing_out",
    "cards_unhealthy",
    "slice_larger_than_any_card",
    "taint",
    "node_selector",
    "other",
)

# Our own share of why a pod waits comes from the placer's verdicts, never from our words.
VERDICT_LABELS: dict[Reason, str] = {
    Reason.NO_ROOM: "gpu_memory_full",
    Reason.NO_EMPTY_CARDS: "gpu_memory_full",
    Reason.CPU: "cpu_or_memory",
    Reason.MEMORY: "cpu_or_memory",
    Reason.HANDING_CARDS: "handing_out",
    Reason.HANDING_SLICE: "handing_out",
    Reason.UNHEALTHY: "cards_unhealthy",
    Reason.TOO_BIG: "slice_larger_than_any_card",
    Reason.TOO_FEW_CARDS: "slice_larger_than_any_card",
    # MODEL, ISOLATION, NO_CARDS, UNREADABLE: nodes the pod may not or cannot use; they say nothing here.
}

# What kube-scheduler's other plugins said, read from its own message in the pod's PodScheduled
# condition (NodeResourcesFit's "Insufficient <resource>", TaintToleration's and NodeAffinity's
# sentences). These are kube-scheduler's words, not ours: the parts of that message that our
# extender wrote are not read (the verdicts above say the same, as values).
SCHEDULER_WORDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # an extended resource, not one of Kubernetes' own (those are below, or "other")
    ("gpu_memory_full", re.compile(r"Insufficient (?!cpu\b|memory\b|ephemeral-storage\b|pods\b|hugepages-)")),
    ("cpu_or_memory", re.compile(r"Insufficient (?:cpu|memory)\b")),
    ("taint", re.compile(r"untolerated taint")),
    ("node_selector", re.compile(r"didn't match Pod's node affinity|node affinity/selector")),
)


def our_reasons(placer: Placer, pod: PendingPod) -> frozenset[Reason]:
    """Why the placer refuses the pod now on the nodes its node selector allows."""
    nodes = [name for name, st in placer.ledger.states().items() if st.node.matches(pod.node_selector)]
    _, not_now, never = placer.candidates(pod.demand, nodes)
    return frozenset(v.reason for v in (*not_now.values(), *never.values()) if v.reason is not None)


def pending_label(pod: PendingPod, ours: Collection[Reason]) -> str:
    """The ``reason`` label of a pending pod (one of :data:`LABELS`), from the placer's
    reasons ``ours`` and what kube-scheduler's other plugins said."""
    if pod.scheduler is None:
        return "not_scheduled_yet"
    found = {VERDICT_LABELS[r] for r in ours if r in VERDICT_LABELS}
    found.update(label for label, words in SCHEDULER_WORDS if words.search(pod.scheduler))
    return next((label for label in LABELS if label in found), "other")


def pending_labels(pending: Mapping[str, PendingPod], ledger: Ledger | None) -> dict[str, str]:
    """Each pending pod's label, by ``namespace/name``. ``ledger``: the placer's view of the
    cluster now; None (not trusted: its watch has failed for a while) leaves only what the
    scheduler said."""
    placer = None if ledger is None else placer_for(ledger)  # its per-node cache serves every scrape
    return {
        key: pending_label(pod, () if placer is None else our_reasons(placer, pod))
        for key, pod in pending.items()
    }


def longest_pending_seconds(doc: Mapping[str, Any]) -> float:
    """Seconds the longest-waiting pending GPU pod has waited (since it was made or handed out),
    at the document's ``generated`` time; 0 when none waits."""
    now = seconds_of(str(doc.get("generated") or ""))
    waits = [
        now - since
        for p in doc["pending"]
        if now is not None and (since := seconds_of(str(p.get("since") or ""))) is not None
    ]
    return max([0.0, *waits])
