"""The ledger: every GPU node's cards and which pod holds how many units of which card.

The API server is the source of truth. A ledger is rebuilt from Node objects
(cards) and Pod annotations (allocations) alone, and kept current by feeding it
the same objects as watch events arrive (:meth:`Ledger.observe_pod`). Placements
a component has just made and not yet seen come back from the API server are
recorded as *assumed* (:meth:`Ledger.commit`) and are not dropped by a stale
watch event that predates them.

Annotations are untrusted input: a pod's record counts only under the rule of
:mod:`.records` (the pod asks the resource, is bound to the record's node, the
cards exist there, and no card ends up holding more than it has). A record that
breaks it is ignored and reported as an :class:`~.records.IgnoredRecord`, which
the I/O layer turns into a Warning event and a metric. A record ignored only
because its card was full is tried again when units on that node are released.
The ledger never over-commits a card through :meth:`commit` or an annotation;
only a card that shrank under its pods can hold more than it has, and
:meth:`overcommitted` reports it; such a card simply has no free units.

ResourceClaims of our DRA driver count the same way (:meth:`Ledger.observe_claim`; the rule is
:mod:`.claims`, the book of which claim holds what :mod:`.claimbook`), under their pod's key.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from .cards import Node, node_from_k8s
from .claimbook import ClaimBook, Counting
from .claims import ClaimObject
from .ledgersnapshot import snapshot
from .objects import NodeObject, PodObject
from .placement import NodeState, OverCommit, Placement
from .records import (
    TERMINAL_PHASES,
    Allocation,
    Ignored,
    IgnoredRecord,
    Reading,
    check_on_node,
    read_allocation,
)
from .resources import DEFAULT_NAMES, ResourceNames

__all__ = [
    "TERMINAL_PHASES",
    "Allocation",
    "Ledger",
    "NodeState",
    "OverCommit",
    "Placement",
    "allocation_from_pod",
]


def allocation_from_pod(
    obj: PodObject,
    node_cards: Callable[[str], Node | None] | None = None,
    names: ResourceNames = DEFAULT_NAMES,
) -> Allocation | None:
    """The allocation a pod's annotations describe if it may count, else ``None`` (see :mod:`.records`)."""
    got = read_allocation(obj, node_cards, names)
    return got if isinstance(got, Allocation) else None


class Ledger:
    """Cards per node and the units each pod holds on them. Pure: no I/O, no clock."""

    def __init__(self, names: ResourceNames = DEFAULT_NAMES) -> None:
        self.names = names
        self._nodes: dict[str, NodeState] = {}
        self._allocs: dict[str, Allocation] = {}
        self._pending: dict[str, Allocation] = {}  # on nodes we do not know (yet)
        self._unreadable: dict[str, str] = {}  # node -> why its card inventory cannot be read
        self._ignored: dict[str, IgnoredRecord] = {}  # records that do not count, and why
        self._blocked: dict[str, Allocation] = {}  # of those, the ones refused only for a full card
        # Which ResourceClaim holds which key; it counts their units through these.
        counting = Counting(
            names=names,
            node=self.node,
            state=self.state,
            allocation=self.allocation,
            blocked=self._blocked,
            ignored=self._ignored,
            drop=self._drop,
            add=self._add,
            release=self.release,
            retry_blocked=self._retry_blocked,
        )
        self._claims = ClaimBook(counting)
        # Bounded log of (sequence, node) changes, so that caches can catch up cheaply.
        self.seq = 0
        self.changes: deque[tuple[int, str]] = deque(maxlen=4096)

    def _touch(self, st: NodeState) -> None:
        st.version += 1
        self.seq += 1
        self.changes.append((self.seq, st.node.name))

    # ---- building -----------------------------------------------------------------
    @classmethod
    def from_objects(
        cls,
        nodes: Iterable[NodeObject],
        pods: Iterable[PodObject],
        names: ResourceNames = DEFAULT_NAMES,
    ) -> Ledger:
        """Rebuild from Node and Pod objects (read by :mod:`.shapes`)."""
        ledger = cls(names)
        for obj in nodes:
            ledger.observe_node(obj)
        for pod in pods:
            ledger.observe_pod(pod)
        return ledger

    def set_node(self, node: Node) -> list[IgnoredRecord]:
        """Add or update a node; returns the records of its pods that cannot count on it."""
        self._unreadable.pop(node.name, None)
        state = self._nodes.get(node.name)
        ignored: list[IgnoredRecord] = []
        if state is None:
            state = self._nodes[node.name] = NodeState(node=node)
            self._touch(state)
            for key, alloc in sorted(self._pending.items()):
                if alloc.node == node.name:
                    del self._pending[key]
                    refused = self._add(alloc)
                    if refused is not None:
                        ignored.append(refused)
        else:
            state.node = node
            self._touch(state)
            self._retry_blocked(node.name)
        return ignored + self._claims.node_known(node.name)

    def observe_node(self, obj: NodeObject) -> list[IgnoredRecord]:
        """A Node object was added or changed; returns pods' records that cannot count on it."""
        node = node_from_k8s(obj, self.names)
        if node is None:
            self.remove_node(obj.name)
            return []
        return self.set_node(node)

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
        for key, alloc in list(self._blocked.items()):
            if alloc.node == name:
                self._pending[key] = self._blocked.pop(key)
                self._ignored.pop(key, None)

    # ---- pods -------------------------------------------------------------------------
    def observe_pod(self, obj: PodObject, deleted: bool = False) -> IgnoredRecord | None:
        """Bring the ledger in line with a Pod object from a list or watch event.

        Returns the decision to ignore the pod's allocation record, if it breaks the
        rule of :mod:`.records` (the caller reports it), else ``None``.
        """
        key = obj.key
        uid = obj.uid
        if self._claims.holds(key):  # the pod's claim counts; its annotation waits aside
            self._claims.set_aside(obj, deleted)
            return None
        current = self._allocs.get(key) or self._pending.get(key)
        if deleted:
            if current is not None and (not uid or not current.uid or current.uid == uid):
                self.release(key)
            self._forget_ignored(key, uid)
            return None
        got: Reading = read_allocation(obj, self.node, self.names)
        if not isinstance(got, Allocation):
            self._forget_ignored(key, "")
            terminal = obj.phase in TERMINAL_PHASES
            # A watch event older than our own bind carries no annotation yet: keep
            # what we assumed unless the pod is finished or is another pod of that name.
            if current is not None and (
                got is not None
                or not current.assumed
                or terminal
                or (uid and current.uid and uid != current.uid)
            ):
                self.release(key)
            if got is not None:
                self._ignored[key] = got
            return got
        if current is not None:
            same = (current.node, current.cards) == (got.node, got.cards)
            if same and current.assigned == got.assigned and not current.assumed:
                return None
            self._drop(key)  # no retry of blocked records in between: this pod's own units come back
        self._forget_ignored(key, "")
        refused = self._add(got)
        if current is not None and refused is not None:
            self._retry_blocked(current.node)
        return refused

    def observe_claim(self, claim: ClaimObject, deleted: bool = False) -> IgnoredRecord | None:
        """Bring the ledger in line with a ResourceClaim (read by :func:`.claims.read_claim`) from
        a list or watch event; returns why its allocation does not count, if it breaks the rule
        of :mod:`.claims` (the caller reports it), else ``None``."""
        return self._claims.observe(claim, deleted)

    def held_by_claim(self, key: str) -> bool:
        """Whether ``key``'s units are a ResourceClaim's, not a pod annotation's."""
        return self._claims.holds(key)

    def claim_allocation(self, claim: str) -> Allocation | None:
        """What ResourceClaim ``claim`` (``namespace/name``) itself holds, counted or waiting; else
        None (its pod's key may sum several claims: :meth:`allocation`)."""
        return self._claims.allocation_of(claim)

    def claims(self) -> list[str]:
        """The ResourceClaims (``namespace/name``) the ledger has seen and not seen deleted."""
        return self._claims.claims()

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
            asks_count=placement.asks_count,
        )
        self._add(alloc)
        return alloc

    def release(self, key: str) -> Allocation | None:
        """Drop a pod's allocation (deleted, finished, or a failed bind rolled back)."""
        alloc = self._drop(key)
        if alloc is not None:
            self._retry_blocked(alloc.node)
        return alloc

    def _drop(self, key: str) -> Allocation | None:
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

    def _add(self, alloc: Allocation) -> IgnoredRecord | None:
        """Count ``alloc`` if it fits beside what its node's cards already hold, else say why not."""
        state = self._nodes.get(alloc.node)
        if state is None:
            self._pending[alloc.key] = alloc
            return None
        if not alloc.assumed:  # commit() checked our own placements already
            checked = check_on_node(alloc, state.node, state.used)
            if isinstance(checked, IgnoredRecord):
                self._ignored[alloc.key] = checked
                if checked.reason is Ignored.CARD_FULL:
                    self._blocked[alloc.key] = alloc
                return checked
            alloc = checked
        self._allocs[alloc.key] = alloc
        state.pods[alloc.key] = alloc
        for share in alloc.cards:
            state.used[share.uuid] = state.used.get(share.uuid, 0) + share.units
        state.cpu_used += alloc.cpu_milli
        state.memory_used += alloc.memory_mib
        self._touch(state)
        return None

    def _retry_blocked(self, node: str) -> None:
        """Records ignored because their card was full may count once units on ``node`` are free."""
        for key, alloc in sorted(self._blocked.items()):
            if alloc.node == node and key not in self._allocs:
                del self._blocked[key]
                self._ignored.pop(key, None)
                self._add(alloc)
        self._claims.retry(node)

    def _forget_ignored(self, key: str, uid: str) -> None:
        held = self._ignored.get(key)
        if held is not None and (not uid or not held.uid or held.uid == uid):
            del self._ignored[key]
            self._blocked.pop(key, None)

    def ignored(self) -> list[IgnoredRecord]:
        """Pods (and ResourceClaims) whose allocation records do not count, and why."""
        out = [self._claims.named(rec) for rec in self._ignored.values()] + self._claims.ignored()
        return sorted(out, key=lambda rec: rec.key)

    # ---- reading ------------------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        return sorted(self._nodes)

    def node(self, name: str) -> Node | None:
        st = self._nodes.get(name)
        return st.node if st else None

    def state(self, name: str) -> NodeState | None:
        """The node's state (cards, holds, version), or None if the ledger does not know it. Read only."""
        return self._nodes.get(name)

    def states(self) -> Mapping[str, NodeState]:
        """Every known node's state by name, unsorted: a live read-only view."""
        return MappingProxyType(self._nodes)

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
        return snapshot(self.names, self._nodes, self._pending, self._unreadable, self.totals())

    def equivalent(self, other: Ledger) -> bool:
        """Same cards, same holders, same amounts (ignores assumed/assigned flags)."""

        def shape(ledger: Ledger) -> tuple[Any, ...]:
            return (
                {n: st.node.cards for n, st in ledger._nodes.items()},
                {n: {u: v for u, v in st.used.items() if v} for n, st in ledger._nodes.items()},
                {k: (a.node, tuple(sorted(a.cards))) for k, a in ledger._allocs.items()},
            )

        return shape(self) == shape(other)
