"""Reading a pod's hold on cards from its annotations, trusting none of them.

Notebook users create their own pods and may write any annotation on them, so an
allocation record is untrusted input. This module is the one rule that every
component (the extender's ledger, the device plugin, the hub service) applies. A
record counts only when:

* the pod asks for the GPU-memory resource, and the record gives it exactly that:
  as many cards as it asks, each share the amount it asks per card (a whole card's
  units for ``gpu-count`` alone);
* the pod is bound (``spec.nodeName``) to the node the record names;
* every card exists on that node, each share is ``1..card units``, no card twice;
* together with the records already counted on that node, no card holds more than
  it has (:func:`check_on_node`; the ledger and the plugin call it per record).

Anything else is *ignored*: the reader returns an :class:`IgnoredRecord` naming the
pod, the reason and the fix, and the I/O layer turns it into a Warning event on the
pod and a metric. Pure: no I/O, no clock.

Pods placed by the old Aliyun extender carry only ``ALIYUN_COM_GPU_MEM_IDX`` and
``_POD``; they are read through the node's card indices under the same rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import Enum

from .annotations import AllocationRecord, CardShare, ContainerShare
from .cards import Node
from .demand import Demand, demand_from_pod
from .errors import InvalidObject
from .names import ALLOCATION_ANNOTATION, GPU_MEM_ASSIGNED, GPU_MEM_IDX, GPU_MEM_POD
from .objects import PodObject
from .resources import DEFAULT_NAMES, ResourceNames

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


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
    asks_count: bool = False  # some container asks whole cards (the device plugin's gpu-count Allocate)

    @property
    def units(self) -> int:
        return sum(c.units for c in self.cards)


class Ignored(Enum):
    """Why an allocation record on a pod was not counted."""

    UNREADABLE = "unreadable"
    NO_DEMAND = "no-demand"
    NOT_BOUND = "not-bound"
    WRONG_NODE = "wrong-node"
    WRONG_AMOUNT = "wrong-amount"
    UNKNOWN_CARD = "unknown-card"
    CARD_FULL = "card-full"
    SHARED = "shared"  # a ResourceClaim reserved for several pods: counted once, and reported


_FIX = {
    Ignored.UNREADABLE: "remove the annotation or recreate the pod so that gpushare-scheduler places it",
    Ignored.NO_DEMAND: "only pods that ask for the resource hold cards; remove the annotation",
    Ignored.NOT_BOUND: "only gpushare-scheduler writes this record, in the same step that binds the pod; "
    "remove the annotation",
    Ignored.WRONG_NODE: "only gpushare-scheduler writes this record; recreate the pod",
    Ignored.WRONG_AMOUNT: "only gpushare-scheduler writes this record; recreate the pod",
    Ignored.UNKNOWN_CARD: "recreate the pod so that gpushare-scheduler places it on a card the node has",
    Ignored.CARD_FULL: "the card is held by other pods' records; recreate the pod so that "
    "gpushare-scheduler places it",
    Ignored.SHARED: "a slice is for one pod: give each pod a ResourceClaim of its own",
}


@dataclass(frozen=True)
class IgnoredRecord:
    """A decision: the allocation record on pod ``key`` does not count, and why."""

    key: str
    uid: str
    reason: Ignored
    detail: str
    node: str = ""

    def message(self) -> str:
        fix = _FIX[self.reason]
        return (
            f"ignoring the GPU allocation written on pod {self.key}: {self.detail}; "
            f"it holds no card. {fix[:1].upper()}{fix[1:]}."
        )


Reading = Allocation | IgnoredRecord | None


def _amount_problem(demand: Demand, shares: tuple[CardShare, ...], names: ResourceNames) -> str:
    """Why ``shares`` are not what ``demand`` asks, or ``""``."""
    if len({s.uuid for s in shares}) != len(shares):
        return "it names one card twice"
    bad = [s for s in shares if s.units < 1]
    if bad:
        return f"card {bad[0].uuid} gets {bad[0].units} units; a share is at least 1"
    if len(shares) != demand.count:
        return f"it names {len(shares)} card(s), the pod asks {demand.describe(names)}"
    if demand.per_card is not None and any(s.units != demand.per_card for s in shares):
        got = ", ".join(names.fmt(s.units) for s in shares)
        return f"it gives {got}, the pod asks {demand.describe(names)}"
    return ""


@dataclass(frozen=True)
class _Pod:
    """The pod whose record is being read, as an :class:`IgnoredRecord` names it."""

    key: str
    uid: str
    bound: str  # spec.nodeName; "" when not bound
    what: str  # the annotation(s) read, as messages name them

    def ignored(self, reason: Ignored, detail: str) -> IgnoredRecord:
        return IgnoredRecord(key=self.key, uid=self.uid, reason=reason, detail=detail, node=self.bound)


_Held = tuple[tuple[CardShare, ...], tuple[ContainerShare, ...]]


def read_allocation(
    obj: PodObject,
    node_cards: Callable[[str], Node | None] | None = None,
    names: ResourceNames = DEFAULT_NAMES,
) -> Reading:
    """The allocation a pod's annotations describe if it may count; why not; or ``None`` (holds nothing).

    ``node_cards`` looks a node up; when it knows the node, the cards are checked
    too (:func:`check_on_node` with nothing used), else that check waits for the
    node. Our UUID record wins over the gpushare indices.
    """
    ann = obj.annotations
    if obj.phase in TERMINAL_PHASES:
        return None
    raw = ann.get(ALLOCATION_ANNOTATION)
    if not raw and GPU_MEM_IDX not in ann and GPU_MEM_POD not in ann:
        return None
    pod = _Pod(
        key=obj.key,
        uid=obj.uid,
        bound=obj.node_name,
        what=ALLOCATION_ANNOTATION if raw else f"{GPU_MEM_IDX}/{GPU_MEM_POD}",
    )
    demand = _demand(obj, pod, names)
    if isinstance(demand, IgnoredRecord):
        return demand
    held = _record_shares(raw, pod) if raw else _legacy_shares(ann, pod)
    if isinstance(held, IgnoredRecord):
        return held
    shares, containers = held
    problem = _amount_problem(demand, shares, names)
    if problem:
        return pod.ignored(Ignored.WRONG_AMOUNT, problem)
    alloc = Allocation(
        key=pod.key,
        uid=pod.uid,
        node=pod.bound,
        cards=shares,
        containers=containers,
        assigned=ann.get(GPU_MEM_ASSIGNED) == "true",
        asks_count=bool(demand.count_containers),
    )
    node = node_cards(pod.bound) if node_cards else None
    if node is None:
        return alloc
    return _checked_on_node(alloc, node, demand, pod)


def _demand(obj: PodObject, pod: _Pod, names: ResourceNames) -> Demand | IgnoredRecord:
    """What the pod asks; a record on a pod that asks nothing, or that is not bound, is ignored."""
    try:
        demand = demand_from_pod(obj, names, placing=False)
    except InvalidObject as err:
        return pod.ignored(
            Ignored.NO_DEMAND, f"{pod.what} is set but the pod's request is unreadable ({err})"
        )
    if demand is None:
        return pod.ignored(Ignored.NO_DEMAND, f"{pod.what} is set but the pod asks for no {names.memory}")
    if not pod.bound:
        return pod.ignored(Ignored.NOT_BOUND, f"{pod.what} is set but the pod is not bound to a node")
    return demand


def _record_shares(raw: str, pod: _Pod) -> _Held | IgnoredRecord:
    """The cards and container shares our UUID record gives the pod, if it names the pod's node
    and gives each container a share of a card the pod holds."""
    try:
        rec = AllocationRecord.from_json(raw, where=f"pod {pod.key}")
    except InvalidObject as err:
        return pod.ignored(Ignored.UNREADABLE, str(err))
    if rec.node != pod.bound:
        return pod.ignored(
            Ignored.WRONG_NODE, f"the record names node {rec.node}, the pod is bound to {pod.bound}"
        )
    uuids = {s.uuid: s.units for s in rec.cards}
    for c in rec.containers:
        if c.uuid not in uuids or not 1 <= c.units <= uuids[c.uuid]:
            return pod.ignored(
                Ignored.WRONG_AMOUNT,
                f"container {c.container} gets {c.units} units of card {c.uuid}, "
                "which the record does not give the pod",
            )
    # (Containers may add up to more than the pod: init containers run before the others.)
    return rec.cards, rec.containers


def _legacy_shares(ann: Mapping[str, str], pod: _Pod) -> _Held | IgnoredRecord:
    """The cards gpushare's index annotations give the pod, equal shares of its total, known by
    index until the node is known (:func:`_legacy_uuid`)."""
    try:
        indices = [int(i) for i in ann.get(GPU_MEM_IDX, "").split(",") if i.strip()]
        total = int(ann.get(GPU_MEM_POD, ""))
    except ValueError:
        return pod.ignored(Ignored.UNREADABLE, f"{GPU_MEM_IDX}/{GPU_MEM_POD} are not whole numbers")
    if not indices or total <= 0 or total % len(indices) or min(indices) < 0:
        return pod.ignored(
            Ignored.WRONG_AMOUNT,
            f"{GPU_MEM_IDX}={indices} and {GPU_MEM_POD}={total} do not describe shares",
        )
    shares = tuple(
        CardShare(uuid=_legacy_uuid(pod.bound, i), index=i, units=total // len(indices)) for i in indices
    )
    return shares, ()


def _checked_on_node(alloc: Allocation, node: Node, demand: Demand, pod: _Pod) -> Allocation | IgnoredRecord:
    """:func:`check_on_node` with nothing used; a pod asking whole cards must get all of each."""
    checked = check_on_node(alloc, node, {})
    if isinstance(checked, Allocation) and demand.whole:
        for s in checked.cards:
            card = node.card(s.uuid)
            if card is not None and s.units != card.units:
                return pod.ignored(
                    Ignored.WRONG_AMOUNT,
                    f"the pod asks whole cards, the record gives it {s.units} of the "
                    f"{card.units} units of card {s.uuid}",
                )
    return checked


def _legacy_uuid(node: str, index: int) -> str:
    """Placeholder UUID of a card known by index only, resolved when the node is known."""
    return f"{node}/gpu{index}"


def check_on_node(alloc: Allocation, node: Node, used: Mapping[str, int]) -> Allocation | IgnoredRecord:
    """``alloc`` with its cards resolved on ``node`` if it fits beside ``used``, else why not.

    ``used``: units already counted per card UUID on this node (by other pods).
    Cards known only by index (gpushare's annotations) get their real UUIDs here.
    """

    def ignored(reason: Ignored, detail: str) -> IgnoredRecord:
        return IgnoredRecord(key=alloc.key, uid=alloc.uid, reason=reason, detail=detail, node=node.name)

    shares = []
    for s in alloc.cards:
        card = node.card(s.uuid)
        if card is None and s.uuid == _legacy_uuid(node.name, s.index):
            card = node.card_by_index(s.index)
        if card is None:
            return ignored(Ignored.UNKNOWN_CARD, f"node {node.name} has no card {s.uuid}")
        if s.units > card.units:
            return ignored(
                Ignored.WRONG_AMOUNT,
                f"card {card.uuid} on node {node.name} has {card.units} units, the record gives the pod "
                f"{s.units}",
            )
        if used.get(card.uuid, 0) + s.units > card.units:
            return ignored(
                Ignored.CARD_FULL,
                f"card {card.uuid} on node {node.name} has {card.units - used.get(card.uuid, 0)} of "
                f"{card.units} units not held by other pods, the record claims {s.units}",
            )
        shares.append(replace(s, uuid=card.uuid, index=card.index))
    if len({s.uuid for s in shares}) != len(shares):
        return ignored(Ignored.WRONG_AMOUNT, "it names one card twice")
    renamed = {old.uuid: new.uuid for old, new in zip(alloc.cards, shares, strict=True)}
    containers = tuple(replace(c, uuid=renamed.get(c.uuid, c.uuid)) for c in alloc.containers)
    return replace(alloc, cards=tuple(shares), containers=containers)
