"""The ledger: every GPU node's cards and which pod holds how many units of which card.

The API server is the source of truth. A ledger is rebuilt from Node objects
(cards) and Pod annotations (allocations) alone, and kept current by feeding it
the same objects as watch events arrive (:meth:`Ledger.observe_pod`). Placements
a component has just made and not yet seen come back from the API server are
recorded as *assumed* (:meth:`Ledger.commit`) and are not dropped by a stale
watch event that predates them.

The ledger never over-commits a card through :meth:`commit`. An over-commitment
read from annotations (a tampered pod, a card that shrank) is kept as the truth
it is and reported by :meth:`overcommitted`; such a card simply has no free units.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .annotations import (
    ALLOCATION_ANNOTATION,
    GPU_MEM_ASSIGNED,
    GPU_MEM_IDX,
    GPU_MEM_POD,
    AllocationRecord,
    CardShare,
    ContainerShare,
)
from .cards import Card, Node, node_from_k8s
from .demand import pod_key
from .errors import GPUShareError, InvalidObject
from .resources import DEFAULT_NAMES, ResourceNames

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


class OverCommit(GPUShareError):
    """A placement would give a card more units than it has. A bug in the caller."""


@dataclass(frozen=True)
class Placement:
    """A decision: this pod's units go onto these cards of this node."""

    key: str
    node: str
    cards: tuple[CardShare, ...]
    containers: tuple[ContainerShare, ...] = ()
    uid: str = ""
    policy: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0

    def record(self) -> AllocationRecord:
        return AllocationRecord(node=self.node, cards=self.cards, containers=self.containers)


@dataclass(frozen=True)
class Allocation:
    """A pod's hold on cards. ``assumed``: placed by us, not yet seen on the API server."""

    key: str
    uid: str
    node: str
    cards: tuple[CardShare, ...]
    containers: tuple[ContainerShare, ...] = ()
    assigned: bool = False
    assumed: bool = False
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def units(self) -> int:
        return sum(c.units for c in self.cards)


@dataclass
class _NodeState:
    node: Node
    used: dict[str, int] = field(default_factory=dict)
    cpu_used: int = 0
    memory_used: int = 0
    version: int = 0
    pods: dict[str, Allocation] = field(default_factory=dict)

    def free(self, card: Card) -> int:
        return max(0, card.units - self.used.get(card.uuid, 0))


def allocation_from_pod(
    obj: Mapping[str, Any],
    node_cards: Callable[[str], Node | None] | None = None,
    names: ResourceNames = DEFAULT_NAMES,
) -> Allocation | None:
    """The allocation a pod's annotations describe, or ``None`` if it holds nothing.

    Our UUID annotation wins. A pod with only gpushare annotations (placed by the
    old Aliyun extender) is read through its node's card indices.
    """
    meta = obj.get("metadata") or {}
    ann = meta.get("annotations") or {}
    status = obj.get("status") or {}
    if status.get("phase") in TERMINAL_PHASES:
        return None
    key = pod_key(obj)
    uid = str(meta.get("uid") or "")
    assigned = ann.get(GPU_MEM_ASSIGNED) == "true"
    raw = ann.get(ALLOCATION_ANNOTATION)
    if raw:
        rec = AllocationRecord.from_json(raw, where=f"pod {key}")
        return Allocation(
            key=key, uid=uid, node=rec.node, cards=rec.cards, containers=rec.containers, assigned=assigned
        )
    node_name = (obj.get("spec") or {}).get("nodeName")
    if GPU_MEM_IDX in ann and GPU_MEM_POD in ann and node_name:
        try:
            indices = [int(i) for i in str(ann[GPU_MEM_IDX]).split(",") if i.strip()]
            total = int(ann[GPU_MEM_POD])
        except ValueError as err:
            raise InvalidObject(
                f"pod {key}: gpushare annotations {GPU_MEM_IDX}/{GPU_MEM_POD} unreadable"
            ) from err
        if not indices or total <= 0 or total % len(indices):
            return None
        node = node_cards(node_name) if node_cards else None
        shares = []
        for idx in indices:
            card = node.card_by_index(idx) if node else None
            uuid = card.uuid if card else f"{node_name}/gpu{idx}"
            shares.append(CardShare(uuid=uuid, index=idx, units=total // len(indices)))
        return Allocation(key=key, uid=uid, node=node_name, cards=tuple(shares), assigned=assigned)
    return None


class Ledger:
    """Cards per node and the units each pod holds on them. Pure: no I/O, no clock."""

    def __init__(self, names: ResourceNames = DEFAULT_NAMES) -> None:
        self.names = names
        self._nodes: dict[str, _NodeState] = {}
        self._allocs: dict[str, Allocation] = {}
        self._pending: dict[str, Allocation] = {}  # on nodes we do not know (yet)
        self._unreadable: dict[str, str] = {}  # node -> why its card inventory cannot be read
        # Bounded log of (sequence, node) changes, so that caches can catch up cheaply.
        self.seq = 0
        self.changes: deque[tuple[int, str]] = deque(maxlen=4096)

    def _touch(self, st: _NodeState) -> None:
        st.version += 1
        self.seq += 1
        self.changes.append((self.seq, st.node.name))

    # ---- building -----------------------------------------------------------------
    @classmethod
    def from_objects(
        cls,
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        names: ResourceNames = DEFAULT_NAMES,
    ) -> Ledger:
        """Rebuild from Node and Pod objects as the API server returns them."""
        ledger = cls(names)
        for obj in nodes:
            ledger.observe_node(obj)
        for pod in pods:
            ledger.observe_pod(pod)
        return ledger

    def set_node(self, node: Node) -> None:
        self._unreadable.pop(node.name, None)
        state = self._nodes.get(node.name)
        if state is None:
            state = self._nodes[node.name] = _NodeState(node=node)
            self._touch(state)
            for key, alloc in list(self._pending.items()):
                if alloc.node == node.name:
                    del self._pending[key]
                    self._add(alloc)
        else:
            state.node = node
            self._touch(state)

    def observe_node(self, obj: Mapping[str, Any]) -> None:
        """A Node object was added or changed."""
        node = node_from_k8s(obj, self.names)
        if node is None:
            self.remove_node(str((obj.get("metadata") or {}).get("name")))
        else:
            self.set_node(node)

    def mark_unreadable(self, name: str, reason: str) -> None:
        """The node's card inventory cannot be read: nothing is placed on it (its old cards
        are not kept), its pods' holds wait, and ``reason`` is what users are told."""
        self.remove_node(name)
        self._unreadable[name] = reason

    def unreadable(self, name: str) -> str | None:
        """Why the node's inventory is unreadable, or None."""
        return self._unreadable.get(name)

    def unreadable_nodes(self) -> list[str]:
        return sorted(self._unreadable)

    def remove_node(self, name: str) -> None:
        """Forget a node. Its pods' allocations wait until the node comes back or they go."""
        self._unreadable.pop(name, None)
        state = self._nodes.pop(name, None)
        if state is None:
            return
        self.seq += 1
        self.changes.append((self.seq, name))
        for key in list(state.pods):
            self._pending[key] = self._allocs.pop(key)

    # ---- pods -------------------------------------------------------------------------
    def observe_pod(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        """Bring the ledger in line with a Pod object from a list or watch event."""
        key = pod_key(obj)
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        current = self._allocs.get(key) or self._pending.get(key)
        if deleted:
            if current is not None and (not uid or not current.uid or current.uid == uid):
                self.release(key)
            return
        alloc = allocation_from_pod(obj, self.node, self.names)
        if alloc is None:
            terminal = (obj.get("status") or {}).get("phase") in TERMINAL_PHASES
            # A watch event older than our own bind carries no annotation yet: keep
            # what we assumed unless the pod is finished or is another pod of that name.
            if current is not None and (
                not current.assumed or terminal or (uid and current.uid and uid != current.uid)
            ):
                self.release(key)
            return
        if current is not None:
            same = (current.node, current.cards) == (alloc.node, alloc.cards)
            if same and current.assigned == alloc.assigned and not current.assumed:
                return
            self.release(key)
        self._add(alloc)

    def commit(self, placement: Placement) -> Allocation:
        """Record a placement we just decided (assumed until the pod is seen with it)."""
        state = self._nodes.get(placement.node)
        if state is None:
            raise OverCommit(f"pod {placement.key}: node {placement.node} is not in the ledger")
        if placement.key in self._allocs or placement.key in self._pending:
            raise OverCommit(f"pod {placement.key} already holds an allocation")
        for share in placement.cards:
            card = state.node.card(share.uuid)
            if card is None:
                raise OverCommit(f"pod {placement.key}: node {placement.node} has no card {share.uuid}")
            if share.units > state.free(card):
                raise OverCommit(
                    f"pod {placement.key}: card {share.uuid} on {placement.node} has "
                    f"{state.free(card)} units free, {share.units} asked"
                )
        alloc = Allocation(
            key=placement.key,
            uid=placement.uid,
            node=placement.node,
            cards=placement.cards,
            containers=placement.containers,
            assumed=True,
            cpu_milli=placement.cpu_milli,
            memory_mib=placement.memory_mib,
        )
        self._add(alloc)
        return alloc

    def release(self, key: str) -> Allocation | None:
        """Drop a pod's allocation (deleted, finished, or a failed bind rolled back)."""
        alloc = self._pending.pop(key, None)
        if alloc is not None:
            return alloc
        alloc = self._allocs.pop(key, None)
        if alloc is None:
            return None
        state = self._nodes.get(alloc.node)
        if state is not None:
            state.pods.pop(key, None)
            for share in alloc.cards:
                left = state.used.get(share.uuid, 0) - share.units
                if left:
                    state.used[share.uuid] = left
                else:
                    state.used.pop(share.uuid, None)
            state.cpu_used -= alloc.cpu_milli
            state.memory_used -= alloc.memory_mib
            self._touch(state)
        return alloc

    def _add(self, alloc: Allocation) -> None:
        state = self._nodes.get(alloc.node)
        if state is None:
            self._pending[alloc.key] = alloc
            return
        self._allocs[alloc.key] = alloc
        state.pods[alloc.key] = alloc
        for share in alloc.cards:
            state.used[share.uuid] = state.used.get(share.uuid, 0) + share.units
        state.cpu_used += alloc.cpu_milli
        state.memory_used += alloc.memory_mib
        self._touch(state)

    # ---- reading ------------------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        return sorted(self._nodes)

    def node(self, name: str) -> Node | None:
        st = self._nodes.get(name)
        return st.node if st else None

    def nodes(self) -> Iterator[Node]:
        for name in sorted(self._nodes):
            yield self._nodes[name].node

    def used(self, node: str, uuid: str) -> int:
        return self._nodes[node].used.get(uuid, 0)

    def free(self, node: str, uuid: str) -> int:
        st = self._nodes[node]
        card = st.node.card(uuid)
        return st.free(card) if card else 0

    def allocation(self, key: str) -> Allocation | None:
        return self._allocs.get(key) or self._pending.get(key)

    def allocations(self) -> list[Allocation]:
        return sorted([*self._allocs.values(), *self._pending.values()], key=lambda a: a.key)

    def cards_in_use(self) -> int:
        return sum(1 for st in self._nodes.values() for u in st.used.values() if u > 0)

    def overcommitted(self) -> list[tuple[str, str, int, int]]:
        """(node, card UUID, used, units) for every card holding more than it has."""
        out = []
        for name in sorted(self._nodes):
            st = self._nodes[name]
            for uuid, used in sorted(st.used.items()):
                card = st.node.card(uuid)
                units = card.units if card else 0
                if used > units:
                    out.append((name, uuid, used, units))
        return out

    def totals(self) -> tuple[int, int]:
        """(units used, units in all cards)."""
        used = sum(sum(st.used.values()) for st in self._nodes.values())
        total = sum(st.node.units for st in self._nodes.values())
        return used, total

    def snapshot(self) -> dict[str, Any]:
        """The ledger as plain JSON-able data (``/inspect``, the dashboard, the CLI)."""
        unit = self.names.unit
        nodes = []
        for name in sorted(self._nodes):
            st = self._nodes[name]
            holders: dict[str, list[dict[str, Any]]] = {}
            for a in st.pods.values():
                for share in a.cards:
                    holders.setdefault(share.uuid, []).append(
                        {"pod": a.key, "units": share.units, "assigned": a.assigned, "assumed": a.assumed}
                    )
            nodes.append(
                {
                    "name": name,
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
        used, total = self.totals()
        return {
            "unit": unit,
            "resource": self.names.memory,
            "used": used,
            "total": total,
            "nodes": nodes,
            "pending": sorted(self._pending),
            "unreadable": [
                {
                    "name": name,
                    "reason": reason,
                    "pods": [
                        {"pod": a.key, "units": a.units}
                        for a in sorted(self._pending.values(), key=lambda a: a.key)
                        if a.node == name
                    ],
                }
                for name, reason in sorted(self._unreadable.items())
            ],
        }

    def equivalent(self, other: Ledger) -> bool:
        """Same cards, same holders, same amounts (ignores assumed/assigned flags)."""

        def shape(ledger: Ledger) -> tuple[Any, ...]:
            return (
                {n: st.node.cards for n, st in ledger._nodes.items()},
                {n: {u: v for u, v in st.used.items() if v} for n, st in ledger._nodes.items()},
                {k: (a.node, tuple(sorted(a.cards))) for k, a in ledger._allocs.items()},
            )

        return shape(self) == shape(other)
