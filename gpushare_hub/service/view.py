"""What the service answers, computed from a report, the hub's servers and the catalogue. Pure.

The documents of ``api/v1/ledger``, ``api/v1/availability`` and ``api/v1/me`` are built
here from values (:class:`~gpushare_hub.core.report.Report`, :class:`HubServer`, the
checked :class:`~gpushare_hub.core.catalogue.Catalogue`), so that they can be tested
without a hub or a cluster; :mod:`.app` only gathers the inputs and answers HTTP.

**Fragmentation** (the dashboard's figure and ``gpushare_fragmentation_gib``): the free
units that no catalogued slice can use, per card, per model and in all, counted by
:mod:`gpushare_hub.core.waste`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from gpushare_hub.core import Ledger, computeshare
from gpushare_hub.core.availability import availability, render
from gpushare_hub.core.catalogue import Catalogue
from gpushare_hub.core.isolation import NodeIsolation
from gpushare_hub.core.reportrows import PodRow, Report
from gpushare_hub.core.usage import NOT_MEASURED
from gpushare_hub.core.waste import DEFINITION as FRAGMENTATION_DEFINITION
from gpushare_hub.core.waste import card_fragment

from .held import held_slice
from .hubservers import HubServer
from .query import Filters

API_VERSION = "v1"

# ---- documents ---------------------------------------------------------------------------------


def ledger_document(
    report: Report,
    servers: Iterable[HubServer],
    catalogue: Catalogue,
    now: datetime,
    filters: Filters = Filters(),
    stale_seconds: float = 0.0,
    gpu_idle_after: int = 1800,
) -> dict[str, Any]:
    """``api/v1/ledger``: nodes with their cards, allocations, pending pods, totals, fragmentation.

    Each allocation carries what its processes do on the card, from the node's plugin:
    ``used_mib``, ``sm_util`` (percent of the card's SMs), ``over_slice``, ``gpu_idle_seconds``
    (None while it works or where it is not measured) and ``gpu_idle`` (idle ``gpu_idle_after``
    seconds or more)."""
    hub = {(s.user, s.server): s for s in servers}
    nodes: list[dict[str, Any]] = []
    allocations: list[dict[str, Any]] = []
    models: dict[str, dict[str, int]] = {}
    fragment_total = 0
    for node in report.nodes:
        if filters.node and node.name != filters.node:
            continue
        cards = []
        for card in node.cards:
            if not filters.keeps_card(node.name, card):
                continue
            tier = node.isolation.effective
            held = [
                {
                    **held_slice(p, card, node.name, hub).to_json(now.timestamp(), gpu_idle_after),
                    "compute": computeshare.in_force(
                        _share_of(catalogue, p.slice), p.units, card.units, tier
                    ),
                }
                for p in card.pods
                if filters.keeps_pod(p)
            ]
            if filters.user and not held:  # a user filter shows the cards that hold their slices
                continue
            fragment = card_fragment(card, catalogue.slices)
            fragment_total += fragment
            free = max(card.units - card.used, 0)
            total = models.setdefault(
                card.model, {"cards": 0, "units": 0, "used": 0, "free": 0, "fragment": 0}
            )
            total["cards"] += 1
            total["units"] += card.units
            total["used"] += card.used
            total["free"] += free
            total["fragment"] += fragment
            allocations += [{**a, "node": node.name} for a in held]
            cards.append(
                {
                    "uuid": card.uuid,
                    "index": card.index,
                    "model": card.model,
                    "units": card.units,
                    "used": card.used,
                    "free": free,
                    "healthy": card.healthy,
                    "fragment": fragment,
                    "allocations": held,
                    "hibernation": card.hibernation.to_json() if card.hibernation is not None else None,
                }
            )
        if (filters.model or filters.user) and not cards and not node.problem:
            continue
        nodes.append(
            {
                "name": node.name,
                "address": node.address,
                "problem": node.problem,
                "isolation": isolation_document(node.isolation),
                "usage_measured": node.usage_measured,
                "cards": cards,
                "unplaced": [_pod(p) for p in node.unplaced if filters.keeps_pod(p)],
            }
        )
    pending = [
        _pod(p)
        for p in report.pending
        if filters.keeps_pod(p) and not filters.node  # pending: on no node
    ]
    return {
        "version": API_VERSION,
        "unit": report.unit,
        "resource": report.resource,
        "generated": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "stale_seconds": None if stale_seconds == float("inf") else round(stale_seconds, 1),
        "gpu_idle_after": gpu_idle_after,
        "filters": {"node": filters.node, "model": filters.model, "user": filters.user},
        "nodes": nodes,
        "allocations": allocations,
        "pending": pending,
        "models": dict(sorted(models.items())),
        "fragmentation": {"units": fragment_total, "definition": FRAGMENTATION_DEFINITION},
        "slices": [{"slug": s.slug, "display_name": s.display_name, "gib": s.gib} for s in catalogue.slices],
        "warnings": list(report.warnings),
    }


def _share_of(catalogue: Catalogue, slug: str | None) -> int | None:
    """The catalogue's explicit compute share of a slice (None: its memory's)."""
    found = catalogue.get(slug) if slug else None
    return found.compute_share if found is not None else None


def _pod(p: PodRow) -> dict[str, Any]:
    return {
        "namespace": p.namespace,
        "pod": p.name,
        "hub_user": p.hub_user,
        "server": p.hub_server,
        "slice": p.slice,
        "units": p.units,
        "since": p.since,
        "reason": p.reason,
    }


def isolation_document(iso: NodeIsolation) -> dict[str, Any]:
    """A node's tier for the API: what it claims, what placement uses, in words, and its check."""
    return {
        "claimed": iso.claimed,
        "tier": iso.effective,
        "words": iso.words,
        "check": iso.check.as_json() if iso.check is not None else None,
        "problem": iso.problem,
        "device_mode": iso.device_mode or None,
    }


def me_document(
    report: Report,
    servers: Iterable[HubServer],
    user: str,
    now: datetime,
    gpu_idle_after: int,
    availability_doc: Mapping[str, Any] | None = None,
    spawn_url: str = "",
) -> dict[str, Any]:
    """``api/v1/me``: the caller's own allocations and pending pods, built for them from the
    report (never filtered from the admins' document).

    Each allocation carries what the caller may know of its card: the GPU memory its processes
    hold (``used_mib``, None where the node does not measure it), the node's isolation tier and
    its last check, and its neighbours on the card as a count and totals, never their names.
    ``larger_free``: the catalogue's slices larger than the caller's largest that could start
    now (from ``api/v1/availability``, which names no one), for the way out of an out-of-memory.
    """
    hub = {(s.user, s.server): s for s in servers if s.user == user}
    shares = {s.get("slug"): s.get("compute_share") for s in (availability_doc or {}).get("slices", [])}
    allocations = []
    for node in report.nodes:
        for card in node.cards:
            if not any(p.hub_user == user for p in card.pods):
                continue
            others = [p for p in card.pods if p.hub_user != user]
            used = [p.used_mib for p in others]
            measured = node.usage_measured and None not in used
            neighbours = {
                "count": len(others),
                "units": sum(p.units for p in others),
                "used_mib": sum(u or 0 for u in used) if measured else None,
            }
            for p in card.pods:
                if p.hub_user != user:
                    continue
                allocations.append(
                    {
                        **held_slice(p, card, node.name, hub).to_json(now.timestamp(), gpu_idle_after),
                        "node": node.name,
                        "usage_note": "" if node.usage_measured else NOT_MEASURED,
                        "isolation": isolation_document(node.isolation),
                        "card": {
                            "model": card.model,
                            "units": card.units,
                            "used": card.used,
                            "free": max(card.units - card.used, 0),
                        },
                        "neighbours": neighbours,
                        "compute": computeshare.in_force(
                            shares.get(p.slice), p.units, card.units, node.isolation.effective
                        ),
                    }
                )
    largest = max((a["units"] for a in allocations), default=0)
    larger = []
    for s in (availability_doc or {}).get("slices", []):
        if s.get("placeable") and s.get("gib") is not None and s["gib"] > largest and s.get("cards") == 1:
            larger.append({"slug": s["slug"], "display_name": s["display_name"], "gib": s["gib"]})
    return {
        "version": API_VERSION,
        "user": user,
        "unit": report.unit,
        "allocations": allocations,
        "pending": [_pod(p) for p in report.pending if p.hub_user == user],
        "larger_free": sorted(larger, key=lambda s: s["gib"]),
        "spawn_url": spawn_url,
    }


def availability_document(
    ledger: Ledger | None, catalogue: Catalogue, node_selector: Mapping[str, str], now: datetime
) -> dict[str, Any]:
    """``api/v1/availability``: per slice, placeable now, how many more fit, largest free blocks.

    Counts only: no user, pod or node name, so every user may read it.
    """
    out = []
    for s in catalogue.slices:
        a = availability(ledger, s.demand(), node_selector) if ledger is not None else None
        out.append(
            {
                "slug": s.slug,
                "display_name": s.display_name,
                "gib": s.gib,
                "cards": s.cards,
                "models": list(s.models),
                "compute_share": s.compute_share,
                "known": a is not None,
                "placeable": bool(a and a.placeable),
                "free": a.free if a else None,
                "never_fits": bool(a and a.permanent),
                "largest_free": dict(a.largest_free) if a else {},
                "text": render(a),
                # The short text, never the placer's own words: those name nodes and other
                # users' pods (e.g. the pod a node is still handing whole cards to).
                "reason": "" if a is None or a.placeable else render(a),
            }
        )
    return {
        "version": API_VERSION,
        "generated": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "unit": ledger.names.unit if ledger is not None else "GiB",
        "slices": out,
    }
