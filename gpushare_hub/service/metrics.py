"""Prometheus metrics of the service, built from the ledger document of :mod:`.view`. Pure.

Every scrape builds a fresh registry from the current document, so the metrics say exactly
what ``api/v1/ledger`` says at that moment (no series of a card that is gone lingers).
Amounts are in the ledger's unit (GiB by default, hence the names). What a pending pod
waits for comes from the placer's verdicts on it (our share) and kube-scheduler's message
(what its other plugins said): see :func:`pending_label`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from .waiting import longest_pending_seconds

PREFIX = "gpushare"
CARD_LABELS = ("node", "card", "index", "model")


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


# Per hub user series: only users holding a slice now, and at most this many (those holding the
# most); the rest are summed under OTHERS, so a hub of thousands of users stays a bounded set.
MAX_USER_SERIES = 200
OTHERS = "(other users)"
NO_HUB_USER = "(not a hub user)"


def per_user(doc: Mapping[str, Any], limit: int = MAX_USER_SERIES) -> dict[str, dict[str, float]]:
    """Per hub user holding slices now: units held, GPU memory used (bytes, measured slices
    only), slices idle on the GPU, slices over their size."""
    rows: dict[str, dict[str, float]] = {}
    for a in doc["allocations"]:
        row = rows.setdefault(a["hub_user"] or NO_HUB_USER, {"held": 0, "used": 0, "idle": 0, "over": 0})
        row["held"] += int(a["units"])
        row["used"] += (a.get("used_mib") or 0) * 1024 * 1024
        row["idle"] += 1 if a.get("gpu_idle") else 0
        row["over"] += 1 if a.get("over_slice") else 0
    if len(rows) <= limit:
        return rows
    ranked = sorted(rows.items(), key=lambda kv: (-kv[1]["held"], kv[0]))
    kept = dict(ranked[: limit - 1])
    rest = {"held": 0.0, "used": 0.0, "idle": 0.0, "over": 0.0}
    for _user, row in ranked[limit - 1 :]:
        for k, v in row.items():
            rest[k] += v
    kept[OTHERS] = rest
    return kept


def render_metrics(
    doc: Mapping[str, Any],
    groups: Mapping[str, list[str]],
    per_group: Mapping[str, int],
    waits: Mapping[str, str],
    budgets: Mapping[str, Any] | None = None,
) -> bytes:
    """The text exposition format of the metrics for one (unfiltered) ledger document.
    ``waits``: the label of each pending pod by ``namespace/name`` (:func:`pending_labels`)."""
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
        "GPU pods that no node has taken, by the kind of what they wait for",
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
    check_failed = Gauge(
        f"{PREFIX}_node_isolation_check_failed",
        "1 where the node's plugin claims an isolation tier its own check did not confirm",
        ["node", "claimed"],
        registry=reg,
    )
    longest_wait = Gauge(
        f"{PREFIX}_pending_longest_seconds",
        "How long the GPU pod that has waited longest for a card has waited (0: none waits)",
        registry=reg,
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
    user_held = Gauge(
        f"{PREFIX}_user_held_{unit}", "GPU memory held by the hub user's slices", ["user"], registry=reg
    )
    user_used = Gauge(
        f"{PREFIX}_user_gpu_memory_used_bytes",
        "GPU memory the hub user's processes hold (from the nodes' device plugins; measured slices only)",
        ["user"],
        registry=reg,
    )
    user_idle = Gauge(
        f"{PREFIX}_user_gpu_idle_slices",
        "The hub user's slices idle on the GPU for gpu_idle_after seconds or more",
        ["user"],
        registry=reg,
    )
    user_over = Gauge(
        f"{PREFIX}_user_slices_over_size",
        "The hub user's slices whose processes hold more than the slice",
        ["user"],
        registry=reg,
    )
    for user, row in per_user(doc).items():
        user_held.labels(user).set(row["held"])
        user_used.labels(user).set(row["used"])
        user_idle.labels(user).set(row["idle"])
        user_over.labels(user).set(row["over"])
    for node in doc["nodes"]:
        for card in node["cards"]:
            labels = (node["name"], card["uuid"], str(card["index"]), card["model"])
            card_used.labels(*labels).set(card["used"])
            card_free.labels(*labels).set(card["free"])
            card_slices.labels(*labels).set(len(card["allocations"]))
    for model, total in doc["models"].items():
        model_used.labels(model).set(total["used"])
        model_free.labels(model).set(total["free"])
    reasons = Counter(waits.get(f"{p['namespace']}/{p['pod']}", "other") for p in doc["pending"])
    for reason, n in reasons.items():
        pending.labels(reason).set(n)
    fragment.set(doc["fragmentation"]["units"])
    broken.set(sum(1 for n in doc["nodes"] if n["problem"]))
    for node in doc["nodes"]:
        check = (node.get("isolation") or {}).get("check")
        if check is not None:
            check_failed.labels(node["name"], str(check.get("claimed", ""))).set(0 if check.get("ok") else 1)
    longest_wait.set(longest_pending_seconds(doc))
    hibernation_metrics(doc, reg)
    for group, (used, limit) in quota_use(doc, groups, per_group).items():
        quota_used.labels(group).set(used)
        quota_limit.labels(group).set(limit)
    if budgets is not None and budgets.get("configured"):
        budget_used = Gauge(
            f"{PREFIX}_user_budget_used_gib_hours",
            "GiB·h the hub user held in the current budget window (quota_gib_hours_window)",
            ["user"],
            registry=reg,
        )
        budget_total = Gauge(
            f"{PREFIX}_user_budget_gib_hours",
            "The hub user's GiB·h budget for the current window, with what admins added",
            ["user"],
            registry=reg,
        )
        for user, (gib_hours, total) in per_user_budgets(budgets["users"]).items():
            budget_used.labels(user).set(gib_hours)
            budget_total.labels(user).set(total)
    return generate_latest(reg)


def hibernation_metrics(doc: Mapping[str, Any], reg: CollectorRegistry) -> None:
    """Hibernation (issue 46): per card of a node that overcommits its cards, its factor and the
    MiB of its slices held and awake (as the ledger's ``hibernation``; one series per card, as
    the other card series), and the slices hibernated now in all."""
    held = Gauge(
        f"{PREFIX}_card_held_mib",
        "GPU memory of every slice on a card of an overcommitting node, awake or hibernated (MiB)",
        CARD_LABELS,
        registry=reg,
    )
    awake = Gauge(
        f"{PREFIX}_card_awake_mib",
        "GPU memory of the slices not hibernated on a card of an overcommitting node (MiB)",
        CARD_LABELS,
        registry=reg,
    )
    factor = Gauge(
        f"{PREFIX}_card_overcommit_factor",
        "How many times its memory a card's slices may hold together (its node's --overcommit)",
        CARD_LABELS,
        registry=reg,
    )
    hibernated = Gauge(
        f"{PREFIX}_hibernated_slices", "Slices hibernated now (their memory in host memory)", registry=reg
    )
    for node in doc["nodes"]:
        for card in node["cards"]:
            hib = card.get("hibernation")
            if hib is None:
                continue
            labels = (node["name"], card["uuid"], str(card["index"]), card["model"])
            held.labels(*labels).set(hib["held_mib"])
            awake.labels(*labels).set(hib["awake_mib"])
            factor.labels(*labels).set(hib["factor"])
    hibernated.set(sum(1 for a in doc["allocations"] if a.get("hibernated_since")))


def per_user_budgets(
    users: list[Mapping[str, Any]], limit: int = MAX_USER_SERIES
) -> dict[str, tuple[float, float]]:
    """Used and total GiB·h per user (api/v1/budgets' rows), bounded as :func:`per_user` is:
    the users who used most keep their series, the rest are summed under OTHERS."""
    rows = {
        str(u["user"]): (
            float(u["used_gib_hours"]),
            float(u["limit_gib_hours"]) + float(u["added_gib_hours"]),
        )
        for u in users
    }
    if len(rows) <= limit:
        return rows
    ranked = sorted(rows.items(), key=lambda kv: (-kv[1][0], kv[0]))
    kept = dict(ranked[: limit - 1])
    rest = ranked[limit - 1 :]
    kept[OTHERS] = (sum(u for _, (u, _t) in rest), sum(t for _, (_u, t) in rest))
    return kept
