"""Who waits ahead of whom for a GPU: the rule the spawner's progress page, its form and the hub
service's ``api/v1/me`` share. Pure.

A spawn waits behind the older pending spawns that need at least the room it needs on a card
model it could use: a smaller spawn ahead does not hold it back (it fits where this one does not).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .demand import Demand
from .objects import Taint, Toleration, tolerates_all


def models_overlap(a: Demand, b: Demand) -> bool:
    if not a.models or not b.models:
        return True
    return bool({m.lower() for m in a.models} & {m.lower() for m in b.models})


def as_large(theirs: Demand, mine: Demand) -> bool:
    """Whether a spawn asking ``theirs`` needs at least the room ``mine`` needs: whole cards
    for whole cards, and for a slice a slice as large or whole cards."""
    if mine.whole:
        return theirs.whole and theirs.count >= mine.count
    return theirs.whole or (theirs.per_card or 0) >= (mine.per_card or 0)


def holds_back(theirs: Demand, mine: Demand) -> bool:
    """Whether a spawn asking ``theirs``, waiting ahead, holds back one asking ``mine``."""
    return models_overlap(mine, theirs) and as_large(theirs, mine)


@dataclass(frozen=True)
class Waiter:
    """A spawn waiting for our scheduler: when its pod was made (and its key, the tie-break), what
    it asks, and where it may run: the nodes kube-scheduler's own checks last let it try, once the
    extender was asked about it (``None`` before: then it holds the nodes its selector allows, and
    only while kube-scheduler says GPU memory alone keeps it waiting)."""

    key: str
    created: str
    demand: Demand
    nodes: frozenset[str] | None = None
    selector: Mapping[str, str] = field(default_factory=dict)
    gpu_only: bool = False  # before any filter call: kube-scheduler said only GPU memory is short
    tolerations: tuple[Toleration, ...] = ()

    @property
    def order(self) -> tuple[str, str]:
        return (self.created, self.key)

    def may_use(self, node: str, labels: Mapping[str, str], taints: tuple[Taint, ...] = ()) -> bool:
        if self.nodes is not None:
            return node in self.nodes
        return (
            self.gpu_only
            and all(labels.get(k) == v for k, v in self.selector.items())
            and tolerates_all(self.tolerations, taints)
        )


class WaitingLine:
    """Spawns served in the order they were made: a node's free room goes to the oldest waiting
    spawn that fits it, so that "N ahead of you" stays true.

    Filled from the pods the extender's informer sees waiting for its scheduler, and from its
    filter calls, which say which nodes passed kube-scheduler's other checks for the pod (a spawn
    that may not run on a node for another reason holds nothing there; before its first filter
    call, its node selector says where it may run). Emptied when a pod binds or goes. At most
    ``limit`` spawns are kept (users make the pods): past it a new one is not recorded, and is
    served as before, in whatever order kube-scheduler tries it.
    """

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._waiting: dict[str, Waiter] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    def seen(
        self,
        key: str,
        created: str,
        demand: Demand,
        nodes: Iterable[str] | None = None,
        selector: Mapping[str, str] | None = None,
        gpu_only: bool | None = None,
        tolerations: tuple[Toleration, ...] | None = None,
    ) -> None:
        """Record (or refresh) a waiting spawn; ``nodes`` from a filter call, ``selector`` and
        ``gpu_only`` from the informer; what is not given is kept from before."""
        old = self._waiting.get(key)
        if old is None and len(self._waiting) >= self.limit:
            return
        where = frozenset(nodes) if nodes is not None else (old.nodes if old is not None else None)
        keep = dict(selector) if selector is not None else (dict(old.selector) if old is not None else {})
        only = gpu_only if gpu_only is not None else (old.gpu_only if old is not None else False)
        tolerated = tolerations if tolerations is not None else (old.tolerations if old is not None else ())
        self._waiting[key] = Waiter(key, created, demand, where, keep, only, tolerated)

    def drop(self, key: str) -> None:
        self._waiting.pop(key, None)

    def older(self, key: str, created: str) -> list[Waiter]:
        """The spawns made before ``key`` (``created``), oldest first: at most ``CONSIDERED``,
        which bounds the work of one filter call whatever the line's length."""
        mine = (created, key)
        return sorted(
            (w for w in self._waiting.values() if w.order < mine and w.key != key), key=lambda w: w.order
        )[:CONSIDERED]


def units_of(demand: Demand) -> int | None:
    """The GPU units a slice demand takes (None for whole cards, whose size is the card's)."""
    return None if demand.whole else (demand.per_card or 0) * demand.count


def takes_their_turn(free: int, mine: int, theirs: Iterable[int]) -> bool:
    """Whether placing ``mine`` units now, where ``free`` units are free, leaves too little for
    the older spawns that wait for the same nodes and fit there now (``theirs``): then it is
    their turn. With room for everyone (a burst of spawns on an empty cluster) nobody waits for
    anybody; the words count free units, not cards, so a fragmented card may still serve a younger
    spawn first (never the other way round: no spawn waits for room that is not there)."""
    claimed = sum(theirs)
    return claimed > 0 and free - mine < claimed


CONSIDERED = 64  # older waiting spawns looked at per filter call
MAX_SCHEDULER_MESSAGE = 4096  # what is read of kube-scheduler's message
# Reasons a node is not the pod's that the line checks itself (labels, taints) or that keep the
# node from every pod alike (cordoned): a pod refused only for these and GPU memory holds its place.
OTHER_NODES_WORDS = (
    "node(s) didn't match Pod's node affinity/selector",
    "node(s) had untolerated taint ",
    "node(s) were unschedulable",
)


def waits_for_gpu_only(message: str, resources: Iterable[str]) -> bool:
    """Whether kube-scheduler's last word on an unschedulable pod (its PodScheduled condition,
    ``0/4 nodes are available: 1 Insufficient aliyun.com/gpu-mem, 3 node(s) didn't match Pod's
    node affinity/selector. preemption: ...``) says that GPU memory alone keeps it from the nodes
    it may use (the others fail on its selector, a taint, or are cordoned, which the line checks
    itself): such a spawn holds its place before the extender was ever asked about it. Any other
    reason (CPU, a volume, a port) and it holds nothing: a pod that cannot run for another reason
    must not keep the room from the spawns behind it."""
    _, colon, rest = message[:MAX_SCHEDULER_MESSAGE].partition("nodes are available: ")
    reasons = rest.split(". ", 1)[0].rstrip(".")  # the first sentence: what each node lacks
    if not colon or not reasons:
        return False
    ours = {f"Insufficient {r}" for r in resources}
    found = False
    for part in reasons.split(", "):
        count, _, why = part.strip().partition(" ")
        if not count.isdigit():
            return False
        if why in ours:
            found = True
        elif not any(why == w or (w.endswith(" ") and why.startswith(w)) for w in OTHER_NODES_WORDS):
            return False
    return found
