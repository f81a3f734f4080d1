"""The ledger as plain JSON-able data (:meth:`.ledger.Ledger.snapshot`: ``/inspect``, the
dashboard, the CLI), read from what the ledger keeps. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .placement import NodeState
from .records import Allocation
from .resources import ResourceNames


def snapshot(
    names: ResourceNames,
    nodes: Mapping[str, NodeState],
    pending: Mapping[str, Allocation],
    unreadable: Mapping[str, str],
    totals: tuple[int, int],
) -> dict[str, Any]:
    """The ledger's ``nodes``, the allocations ``pending`` on nodes it does not know, the nodes
    whose inventory is ``unreadable`` (and why), and its ``totals`` (units used, units in all
    cards)."""
    unit = names.unit
    out = []
    for name in sorted(nodes):
        st = nodes[name]
        holders: dict[str, list[dict[str, Any]]] = {}
        for a in st.pods.values():
            for share in a.cards:
                holders.setdefault(share.uuid, []).append(
                    {"pod": a.key, "units": share.units, "assigned": a.assigned, "assumed": a.assumed}
                )
        iso = st.node.isolation
        out.append(
            {
                "name": name,
                "isolation": {"claimed": iso.claimed, "tier": iso.effective, "problem": iso.problem},
                "cards": [
                    {
                        "index": c.index,
                        "uuid": c.uuid,
                        "model": c.model,
                        "units": c.units,
                        "used": st.used.get(c.uuid, 0),
                        "free": st.free(c),
                        "healthy": c.healthy,
                        "pods": sorted(holders.get(c.uuid, []), key=lambda h: h["pod"]),
                    }
                    for c in st.node.cards
                ],
            }
        )
    used, total = totals
    return {
        "unit": unit,
        "resource": names.memory,
        "used": used,
        "total": total,
        "nodes": out,
        "pending": sorted(pending),
        "unreadable": [
            {
                "name": name,
                "reason": reason,
                "pods": [
                    {"pod": a.key, "units": a.units}
                    for a in sorted(pending.values(), key=lambda a: a.key)
                    if a.node == name
                ],
            }
            for name, reason in sorted(unreadable.items())
        ],
    }
