"""The report's rows (:mod:`.report`): per node, per card and per pod, and the whole report with
its JSON. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpushare_hub.core.hibernated import CardHibernation
from gpushare_hub.core.isolation import NodeIsolation


@dataclass(frozen=True)
class PodRow:
    namespace: str
    name: str
    units: int
    hub_user: str = ""
    hub_server: str = ""
    reason: str = ""
    slice: str = ""  # the hub's catalogue slug, when the spawner wrote one
    since: str = ""  # RFC 3339 UTC: when the card was assigned (else the pod started or was made)
    created: str = ""  # RFC 3339 UTC: when the pod was made
    scheduled: str = ""  # RFC 3339 UTC: when it was bound to its node ("" while unknown)
    used_mib: int | None = None  # GPU memory its processes hold on the card (None: not measured)
    sm_util: int | None = None  # percent of the card's SMs its processes keep busy (None: not measured)
    idle_since: int | None = None  # Unix seconds it has been idle on the GPU from (None: active, or unknown)
    over_slice: bool = False  # its processes hold more than its slice on the card
    uid: str = ""  # the pod's UID (what a node's hibernation book names it by)
    hibernated_since: int | None = None  # Unix seconds it is hibernated from (None: awake, or no overcommit)


@dataclass(frozen=True)
class CardRow:
    index: int
    uuid: str
    model: str
    units: int
    used: int
    healthy: bool
    pods: tuple[PodRow, ...] = ()
    hibernation: CardHibernation | None = None  # on a node that overcommits its cards


@dataclass(frozen=True)
class NodeRow:
    name: str
    address: str
    cards: tuple[CardRow, ...] = ()
    # GPU pods bound here that hold no card (Aliyun's PENDING column).
    unplaced: tuple[PodRow, ...] = ()
    # Set when the node advertises GPU memory but its card inventory cannot be read.
    problem: str = ""
    isolation: NodeIsolation = field(default_factory=NodeIsolation)
    usage_measured: bool = False  # the node's plugin publishes per-pod GPU memory in use

    @property
    def used(self) -> int:
        return sum(c.used for c in self.cards) + sum(p.units for p in self.unplaced)

    @property
    def total(self) -> int:
        return sum(c.units for c in self.cards)


@dataclass(frozen=True)
class Report:
    unit: str
    resource: str
    nodes: tuple[NodeRow, ...]
    pending: tuple[PodRow, ...] = ()  # GPU pods no node has taken yet
    warnings: tuple[str, ...] = field(default=())

    @property
    def used(self) -> int:
        return sum(n.used for n in self.nodes)

    @property
    def total(self) -> int:
        return sum(n.total for n in self.nodes)

    def to_json(self) -> dict[str, Any]:
        def pod(p: PodRow) -> dict[str, Any]:
            out: dict[str, Any] = {"namespace": p.namespace, "name": p.name, "units": p.units}
            if p.hub_user:
                out["hub_user"] = p.hub_user
                out["hub_server"] = p.hub_server
            if p.reason:
                out["reason"] = p.reason
            if p.used_mib is not None:  # the node's plugin measures usage
                out["used_mib"] = p.used_mib
                out["over_slice"] = p.over_slice
                out["sm_util"] = p.sm_util
                out["idle_since"] = p.idle_since
            return out

        return {
            "unit": self.unit,
            "resource": self.resource,
            "used": self.used,
            "total": self.total,
            "nodes": [
                {
                    "name": n.name,
                    "address": n.address,
                    "used": n.used,
                    "total": n.total,
                    **({"problem": n.problem} if n.problem else {}),
                    "cards": [
                        {
                            "index": c.index,
                            "uuid": c.uuid,
                            "model": c.model,
                            "units": c.units,
                            "used": c.used,
                            "free": max(c.units - c.used, 0),
                            "healthy": c.healthy,
                            "pods": [pod(p) for p in c.pods],
                        }
                        for c in n.cards
                    ],
                    "unplaced": [pod(p) for p in n.unplaced],
                }
                for n in self.nodes
            ],
            "pending": [pod(p) for p in self.pending],
            "warnings": list(self.warnings),
        }
