"""Prometheus metrics of the service, built from the ledger document of :mod:`.view`. Pure.

Every scrape builds a fresh registry from the current document, so the metrics say exactly
what ``api/v1/ledger`` says at that moment (no series of a card that is gone lingers).
Amounts are in the ledger's unit (GiB by default, hence the names).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

PREFIX = "gpushare"
CARD_LABELS = ("node", "card", "index", "model")


# ``gpushare_pending_pods{reason=...}``: a fixed set of values, first match wins, in the order of
# what a pod most plausibly waits for. The scheduler's message itself names nodes, pods and
# counts (a new label value per cluster size, and names that metrics readers need not see); the
# dashboard and api/v1/ledger keep it whole.
REASONS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("not_scheduled_yet", re.compile(r"^not scheduled yet$")),
    (
        "gpu_memory_full",
        re.compile(
            r"card(?: on node \S+)? has .* free|no node has free now|empty .*card\(s\)"
            # an extended resource, not one of Kubernetes' own (those are below, or "other")
            r"|Insufficient (?!cpu\b|memory\b|ephemeral-storage\b|pods\b|hugepages-)"
        ),
    ),
    ("cpu_or_memory", re.compile(r"Insufficient (?:cpu|memory)\b|CPU free|memory free")),
    ("handing_out", re.compile(r"still handing|waits until that allocation")),
    ("cards_unhealthy", re.compile(r"unhealthy")),
    ("slice_larger_than_any_card", re.compile(r"hold at most|can ever hold|usable .*card")),
    ("taint", re.compile(r"untolerated taint")),
    ("node_selector", re.compile(r"didn't match Pod's node affinity|node affinity/selector")),
)


def reason_label(reason: str) -> str:
    """The ``reason`` label of a pending pod: one of :data:`REASONS`' names, else ``other``."""
    text = reason or "not scheduled yet"
    return next((name for name, pattern in REASONS if pattern.search(text)), "other")


def quota_use(
    doc: Mapping[str, Any], groups: Mapping[str, list[str]], per_group: Mapping[str, int]
) -> dict[str, tuple[int, int]]:
    """Per group with a quota: (units its members hold now, the group's per-user quota)."""
    held: Counter[str] = Counter()
    for alloc in doc["allocations"]:
        held[alloc["hub_user"]] += int(alloc["units"])
    return {
        group: (sum(n for user, n in held.items() if group in groups.get(user, [])), limit)
        for group, limit in sorted(per_group.items())
    }


def render_metrics(
    doc: Mapping[str, Any], groups: Mapping[str, list[str]], per_group: Mapping[str, int]
) -> bytes:
    """The text exposition format of the metrics for one (unfiltered) ledger document."""
    reg = CollectorRegistry()
    unit = str(doc.get("unit", "GiB")).lower()
    card_used = Gauge(
        f"{PREFIX}_card_used_{unit}", "GPU memory held by pods, per card", CARD_LABELS, registry=reg
    )
    card_free = Gauge(f"{PREFIX}_card_free_{unit}", "GPU memory free, per card", CARD_LABELS, registry=reg)
    card_slices = Gauge(
        f"{PREFIX}_card_slices", "Pods holding a slice of the card", CARD_LABELS, registry=reg
    )
    model_used = Gauge(
        f"{PREFIX}_model_used_{unit}", "GPU memory held, per card model", ["model"], registry=reg
    )
    model_free = Gauge(
        f"{PREFIX}_model_free_{unit}", "GPU memory free, per card model", ["model"], registry=reg
    )
    pending = Gauge(
        f"{PREFIX}_pending_pods",
        "GPU pods that no node has taken, by the kind of the scheduler's reason",
        ["reason"],
        registry=reg,
    )
    fragment = Gauge(
        f"{PREFIX}_fragmentation_{unit}",
        "Free GPU memory that no catalogued slice can use (see docs/reference/hub-service.md#fragmentation)",
        registry=reg,
    )
    broken = Gauge(
        f"{PREFIX}_node_inventory_unreadable", "Nodes whose card inventory cannot be read", registry=reg
    )
    quota_used = Gauge(
        f"{PREFIX}_quota_used_{unit}",
        "GPU memory held by the members of a group with a quota",
        ["group"],
        registry=reg,
    )
    quota_limit = Gauge(
        f"{PREFIX}_quota_limit_{unit}",
        "The group's GPU quota per user (quota_gib_per_group)",
        ["group"],
        registry=reg,
    )
    for node in doc["nodes"]:
        for card in node["cards"]:
            labels = (node["name"], card["uuid"], str(card["index"]), card["model"])
            card_used.labels(*labels).set(card["used"])
            card_free.labels(*labels).set(card["free"])
            card_slices.labels(*labels).set(len(card["allocations"]))
    for model, total in doc["models"].items():
        model_used.labels(model).set(total["used"])
        model_free.labels(model).set(total["free"])
    reasons = Counter(reason_label(p["reason"]) for p in doc["pending"])
    for reason, n in reasons.items():
        pending.labels(reason).set(n)
    fragment.set(doc["fragmentation"]["units"])
    broken.set(sum(1 for n in doc["nodes"] if n["problem"]))
    for group, (used, limit) in quota_use(doc, groups, per_group).items():
        quota_used.labels(group).set(used)
        quota_limit.labels(group).set(limit)
    return generate_latest(reg)
