"""Where Kubernetes' own device allocation (DRA) would put a slice, as replayer policies. Pure.

The DRA allocator of kube-scheduler (1.36, consumable capacity) takes, on the node the
scheduler chose, the FIRST device in its ResourceSlice's order whose remaining capacity holds
the claim; nothing scores devices by capacity. The node is chosen by the default plugins, none
of which knows DRA capacity: NodeResourcesFit (LeastAllocated on CPU and memory, weight 1) plus
NodeResourcesBalancedAllocation (weight 1), both on the pods' CPU and memory requests.

* ``dra-first-fit``: a driver that lists its cards in index order; the default node choice.
* ``dra-ordered``: a driver that re-publishes its slice with the fullest card first (ascending
  free memory, ties by index), so that first fit is best fit; the default node choice.
* ``dra-ordered-mostallocated``: the same devices, and a scheduler profile whose
  NodeResourcesFit scores MostAllocated (on CPU and memory: a configuration, no extender).
* ``dra-ordered-binpack``: the same devices, plus a prioritize-only scheduler extender that
  scores nodes as our binpack does (weight high enough to lead); the default plugins' score
  breaks its ties. The extender never binds: the DRA allocator still picks the device.

:func:`default_node_score` follows kube-scheduler's integer arithmetic (``MaxNodeScore`` 100).
A node's CPU and memory are its own where it tracks them, else the capacities given, else
:data:`NOMINAL_NODE` (the trace's commonest T4 node). Ties fall to the node name (the real
scheduler draws among equal scores at random). Not modelled: percentageOfNodesToScore (a
rotating sample of 100+ feasible nodes on large clusters), the non-zero request defaults for
pods without requests, and the plugins that score every node alike for these pods.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .cards import Card
from .demand import Demand
from .ledger import Ledger
from .policy import Binpack, NodeView, Policy

MAX_NODE_SCORE = 100


@dataclass(frozen=True)
class HostCapacity:
    """A node's allocatable CPU (milli) and memory (MiB), as kube-scheduler reads them."""

    cpu_milli: int
    memory_mib: int


# The trace's commonest T4 node (387 of its 404 T4 nodes): 104 cores, 512 GiB.
NOMINAL_NODE = HostCapacity(cpu_milli=104_000, memory_mib=524_288)


def _least_requested(requested: int, capacity: int) -> int:
    """NodeResourcesFit's LeastAllocated score of one resource (integer, 0..100)."""
    if capacity <= 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def _most_requested(requested: int, capacity: int) -> int:
    """NodeResourcesFit's MostAllocated score of one resource (integer, 0..100)."""
    if capacity <= 0:
        return 0
    return min(requested, capacity) * MAX_NODE_SCORE // capacity


def default_node_score(
    cpu_requested: int, memory_requested: int, capacity: HostCapacity, most: bool = False
) -> int:
    """The default plugins' score of a node whose pods, the incoming one included, request
    ``cpu_requested`` milli-CPU and ``memory_requested`` MiB: LeastAllocated (``most``:
    MostAllocated; CPU and memory weighted 1 each) plus BalancedAllocation, 0..200; higher wins."""
    fit = _most_requested if most else _least_requested
    least = (fit(cpu_requested, capacity.cpu_milli) + fit(memory_requested, capacity.memory_mib)) // 2
    fractions = [
        min(1.0, requested / total) if total > 0 else 1.0
        for requested, total in (
            (cpu_requested, capacity.cpu_milli),
            (memory_requested, capacity.memory_mib),
        )
    ]
    std = abs(fractions[0] - fractions[1]) / 2  # the standard deviation of two values
    balanced = int((1 - std) * MAX_NODE_SCORE)
    return least + balanced


class DefaultScheduler:
    """The default node score of a candidate, read from the ledger's record of each node's
    CPU and memory requests (which the ledger keeps whether or not the node checks them)."""

    def __init__(
        self,
        ledger: Ledger,
        capacities: Mapping[str, HostCapacity] | None = None,
        nominal: HostCapacity = NOMINAL_NODE,
        most: bool = False,
    ) -> None:
        self.ledger = ledger
        self.capacities = dict(capacities or {})
        self.nominal = nominal
        self.most = most

    def capacity(self, name: str) -> HostCapacity:
        st = self.ledger.state(name)
        if st is not None and st.node.cpu_milli is not None and st.node.memory_mib is not None:
            return HostCapacity(st.node.cpu_milli, st.node.memory_mib)
        return self.capacities.get(name, self.nominal)

    def score(self, name: str, demand: Demand) -> int:
        st = self.ledger.state(name)
        cpu, memory = (0, 0) if st is None else (st.cpu_used, st.memory_used)
        return default_node_score(
            cpu + demand.cpu_milli, memory + demand.memory_mib, self.capacity(name), self.most
        )


class DraFirstFit(Policy):
    """The card: the first in index order that holds the slice. The node: the default score."""

    name = "dra-first-fit"

    def __init__(self, scheduler: DefaultScheduler) -> None:
        self.scheduler = scheduler

    def card_key(self, view: NodeView, card: Card, free: int, take: int) -> tuple[float, ...]:
        return (card.index,)

    def node_key(
        self, view: NodeView, chosen: tuple[tuple[Card, int], ...], demand: Demand, take: int
    ) -> tuple[float, ...]:
        return (-self.scheduler.score(view.name, demand),)


class DraOrdered(DraFirstFit):
    """The card: the first in a slice ordered fullest first, i.e. the fullest card that holds
    the slice (best fit). The node: the default score."""

    name = "dra-ordered"

    def card_key(self, view: NodeView, card: Card, free: int, take: int) -> tuple[float, ...]:
        return (free, card.index)


class DraOrderedMostAllocated(DraOrdered):
    """Ordered devices, nodes by a profile scoring MostAllocated on CPU and memory."""

    name = "dra-ordered-mostallocated"

    def __init__(self, scheduler: DefaultScheduler) -> None:
        super().__init__(DefaultScheduler(scheduler.ledger, scheduler.capacities, scheduler.nominal, True))


class DraOrderedBinpack(DraOrdered):
    """Ordered devices, and nodes ranked by binpack's node key first (a prioritize-only
    extender), the default score next."""

    name = "dra-ordered-binpack"

    def __init__(self, scheduler: DefaultScheduler) -> None:
        super().__init__(scheduler)
        self.binpack = Binpack()

    def node_key(
        self, view: NodeView, chosen: tuple[tuple[Card, int], ...], demand: Demand, take: int
    ) -> tuple[float, ...]:
        ours = self.binpack.node_key(view, chosen, demand, take)
        return (*ours, -self.scheduler.score(view.name, demand))


DraFactory = Callable[[DefaultScheduler], Policy]
DRA_POLICIES: dict[str, DraFactory] = {
    DraFirstFit.name: DraFirstFit,
    DraOrdered.name: DraOrdered,
    DraOrderedMostAllocated.name: DraOrderedMostAllocated,
    DraOrderedBinpack.name: DraOrderedBinpack,
}


def make_dra_policy(
    name: str, ledger: Ledger, capacities: Mapping[str, HostCapacity] | None = None
) -> Policy:
    """DRA policy ``name`` scoring nodes on ``ledger``; ValueError naming them for another name."""
    try:
        factory = DRA_POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown DRA policy {name!r}; choose one of {', '.join(DRA_POLICIES)}") from None
    return factory(DefaultScheduler(ledger, capacities))
