"""What `kubectl inspect gpushare` shows, computed from Node and Pod objects. Pure: no I/O.

The numbers come from the shared ledger (:class:`~gpushare_hub.core.ledger.Ledger`), so the
table agrees with what the extender decides. Beside the ledger it keeps what the table
needs and the ledger does not: pod names, the hub user and server KubeSpawner writes on
the pod, GPU pods bound to a node without a card (Aliyun's ``PENDING`` column), and GPU
pods that no node has taken yet, with the scheduler's reason.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpushare_hub.core.annotations import GPU_MEM_ASSUME_TIME, PREFIX
from gpushare_hub.core.demand import demand_from_pod, pod_key
from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.ledger import TERMINAL_PHASES, Ledger
from gpushare_hub.core.resources import DEFAULT_NAMES, ResourceNames

HUB_USER = "hub.jupyter.org/username"
HUB_SERVER = "hub.jupyter.org/servername"
SLICE = f"{PREFIX}/slice"  # GPUShareSpawner's catalogue slug (gpushare_hub.spawner.pod)


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


@dataclass(frozen=True)
class CardRow:
    index: int
    uuid: str
    model: str
    units: int
    used: int
    healthy: bool
    pods: tuple[PodRow, ...] = ()


@dataclass(frozen=True)
class NodeRow:
    name: str
    address: str
    cards: tuple[CardRow, ...] = ()
    # GPU pods bound here that hold no card (Aliyun's PENDING column).
    unplaced: tuple[PodRow, ...] = ()
    # Set when the node advertises GPU memory but its card inventory cannot be read.
    problem: str = ""

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


def _address(node: Mapping[str, Any]) -> str:
    for addr in (node.get("status") or {}).get("addresses") or []:
        if addr.get("type") == "InternalIP" and addr.get("address"):
            return str(addr["address"])
    return "unknown"


def _offers_gpu_memory(node: Mapping[str, Any], names: ResourceNames) -> bool:
    status = node.get("status") or {}
    raw = (status.get("allocatable") or status.get("capacity") or {}).get(names.memory)
    return raw not in (None, "0", 0)


def _since(pod: Mapping[str, Any]) -> str:
    """When the pod got its card: the extender's assume time, else its start or creation."""
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(GPU_MEM_ASSUME_TIME)
    if isinstance(raw, str) and raw.isdigit() and len(raw) <= 20:
        when = datetime.fromtimestamp(int(raw) / 1e9, tz=UTC)
        return when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return str((pod.get("status") or {}).get("startTime") or meta.get("creationTimestamp") or "")


def _unreadable(key: str, err: Exception) -> str:
    """A warning for a pod that could not be read: our errors name the pod already."""
    return str(err) if isinstance(err, GPUShareError) else f"pod {key}: {err}"


def _scheduling_reason(pod: Mapping[str, Any]) -> str:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "")
    return "not scheduled yet"


def build_report(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    names: ResourceNames = DEFAULT_NAMES,
    only_node: str | None = None,
    hub_namespaces: Collection[str] | None = None,
) -> Report:
    """The report for every GPU-sharing node (or ``only_node``) and the active GPU pods.

    ``hub_namespaces``: where the hub's spawner creates its pods. The hub user and server
    annotations are believed only on pods there (anyone who may create a pod elsewhere could
    write another user's name on it); None believes them everywhere (the CLI, run by admins).
    """
    warnings: list[str] = []
    ledger = Ledger(names)
    node_objs: dict[str, Mapping[str, Any]] = {}
    problems: dict[str, str] = {}
    for obj in nodes:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if only_node and name != only_node:
            continue
        try:
            ledger.observe_node(obj)
        except Exception as err:  # GPUShareError: says why; anything else must not end the report
            if _offers_gpu_memory(obj, names):
                problems[name] = f"card inventory unreadable: {err}"
                node_objs[name] = obj
            continue
        if ledger.node(name) is not None:
            node_objs[name] = obj

    active = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL_PHASES]
    rows: dict[str, PodRow] = {}
    unplaced: dict[str, list[PodRow]] = {}
    pending: list[PodRow] = []
    for pod in active:
        key = pod_key(pod)
        try:
            demand = demand_from_pod(pod, names)
        except Exception as err:  # GPUShareError: says why; anything else must not end the report
            warnings.append(_unreadable(key, err))
            continue
        if demand is None or not demand.wants_gpu:
            continue
        meta = pod.get("metadata") or {}
        ann = meta.get("annotations") or {}
        node_name = (pod.get("spec") or {}).get("nodeName")
        units = demand.per_card * demand.count if demand.per_card is not None else 0
        namespace = str(meta.get("namespace") or "default")
        if hub_namespaces is not None and namespace not in hub_namespaces:
            ann = {}
        row = PodRow(
            namespace=namespace,
            name=str(meta.get("name") or ""),
            units=units,
            hub_user=str(ann.get(HUB_USER) or ""),
            hub_server=str(ann.get(HUB_SERVER) or ""),
            slice=str(ann.get(SLICE) or ""),
            since=_since(pod),
        )
        rows[key] = row
        if only_node and node_name != only_node:
            continue
        try:
            ignored = ledger.observe_pod(pod)
        except Exception as err:  # GPUShareError: says why; anything else must not end the report
            warnings.append(_unreadable(key, err))
        else:
            if ignored is not None:  # a forged or unreadable record: it holds no card, say why
                warnings.append(ignored.message())
        if not node_name:
            pending.append(replace(row, reason=_scheduling_reason(pod)))
        elif ledger.allocation(key) is None and node_name in node_objs:
            unplaced.setdefault(node_name, []).append(row)

    out: list[NodeRow] = []
    for name in sorted(node_objs):
        node = ledger.node(name)
        cards: list[CardRow] = []
        if node is not None:
            holders: dict[str, list[PodRow]] = {}
            for alloc in ledger.allocations():
                if alloc.node != name:
                    continue
                namespace, _, pod_name = alloc.key.partition("/")
                base = rows.get(alloc.key) or PodRow(namespace=namespace, name=pod_name, units=0)
                for share in alloc.cards:
                    holders.setdefault(share.uuid, []).append(replace(base, units=share.units))
            for card in sorted(node.cards, key=lambda c: c.index):
                cards.append(
                    CardRow(
                        index=card.index,
                        uuid=card.uuid,
                        model=card.model,
                        units=card.units,
                        used=ledger.used(name, card.uuid),
                        healthy=card.healthy,
                        pods=tuple(sorted(holders.get(card.uuid, []), key=lambda p: (p.namespace, p.name))),
                    )
                )
        out.append(
            NodeRow(
                name=name,
                address=_address(node_objs[name]),
                cards=tuple(cards),
                unplaced=tuple(sorted(unplaced.get(name, []), key=lambda p: (p.namespace, p.name))),
                problem=problems.get(name, ""),
            )
        )
    return Report(
        unit=names.unit,
        resource=names.memory,
        nodes=tuple(out),
        pending=tuple(sorted(pending, key=lambda p: (p.namespace, p.name))),
        warnings=tuple(warnings),
    )
