"""Stranding-aware placement: FGD plus the GPU capacity a node's CPU and memory would strand.

FGD (:mod:`.fragmentation`) asks, for each task shape of the target workload, whether
*one* task of that shape still fits a node; if it does, the node's idle GPU counts as
usable for that shape. On the Alibaba trace that is too generous: GPU nodes run short
of CPU long before their cards are full (an 8-card node with 96 cores holds eight
1-card tasks of 11 cores, but only four of 20), and sharing tasks leave remainders
(a 470 m task on a card with 1000 m free leaves 60 m no 470 m task can use).

This module adds a second measure, *stranded capacity*. For a task shape ``s`` the node
can hold ``k_s = min(gpu slots, cpu_free // cpu_s, memory_free // memory_s)`` more
tasks of that shape, where the GPU slots are ``sum(free // units_s)`` over the cards for a
sharing shape and ``empty cards // count_s`` for a whole-card shape. What ``k_s`` tasks
leave of the node's idle GPU is stranded for ``s``; the measure is the expectation over
the workload's shapes, weighted by how often each occurs (as in FGD):

    stranded(node) = sum_s p_s * (idle(node) - k_s * gpu_s)

:class:`StrandAware` places each pod where ``2 * d(stranded) + d(fgd fragmentation)`` grows
least (ties: the fullest card, then the fullest node), and picks the card inside a node
by the stranded measure alone. Both measures cost one pass over the workload's shapes
per node state and are memoised by node state, so a node's verdict stays cheap enough
for the extender's per-node cache.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from .cards import Card
from .demand import Demand
from .fragmentation import FragmentationGradient, Shape, Workload, card_delta, node_delta
from .policy import NodeView, Policy, register_policy

# Weight of the stranded measure's change against FGD's (measured on the default trace;
# see docs/measurements/2026-11-26-packing-past-fgd.md).
STRAND_WEIGHT = 2.0
# Memoised node states kept per workload before the memo starts again.
MAX_MEMO = 200_000

Frees = tuple[tuple[int, int], ...]  # (free units, card units) per card


class StrandedCapacity:
    """A task-shape distribution, and the idle GPU units it would strand on a node.

    Shapes with the same GPU part (units per card, card count) are grouped so that a
    node's GPU slots are counted once per group; CPU and memory then cap each shape.
    """

    def __init__(self, shapes: Mapping[Shape, float] | Iterable[Shape] = ()) -> None:
        counts: Counter[Shape] = Counter()
        if isinstance(shapes, Mapping):
            counts.update({s: float(w) for s, w in shapes.items()})
        else:
            counts.update(shapes)
        self._counts: Counter[Shape] = Counter({s: w for s, w in counts.items() if s.count > 0 and w > 0})
        self._freeze()

    def _freeze(self) -> None:
        total = sum(self._counts.values()) or 1.0
        self._frozen_total = total
        groups: dict[tuple[int | None, int], list[tuple[int, int, float]]] = {}
        for s, w in self._counts.items():
            groups.setdefault((s.per_card, s.count), []).append((s.cpu_milli, s.memory_mib, w / total))
        self._groups = sorted(
            ((key, sorted(members), sum(p for _, _, p in members)) for key, members in groups.items()),
            key=lambda g: (g[0][0] is None, g[0][0] or 0, g[0][1]),
        )
        self._memo: dict[tuple[Frees, int | None, int | None], float] = {}

    def add(self, shape: Shape) -> None:
        """Count one more task of ``shape`` (refreshed as :meth:`Workload.add` does)."""
        if shape.count <= 0:
            return
        new = shape not in self._counts
        self._counts[shape] += 1
        if new or sum(self._counts.values()) > 1.05 * self._frozen_total:
            self._freeze()

    def __bool__(self) -> bool:
        return bool(self._groups)

    @staticmethod
    def _slots(frees: Frees, per_card: int | None, count: int) -> tuple[int, int]:
        """(tasks of this GPU part the cards can still take, GPU units one task takes)."""
        if per_card is None:
            empty = [size for f, size in frees if f == size and size > 0]
            if not empty:
                return 0, 0
            return len(empty) // count, count * min(empty)
        if count == 1:
            return sum(f // per_card for f, _ in frees), per_card
        return sum(1 for f, _ in frees if f >= per_card) // count, count * per_card

    def stranded(self, frees: Frees, cpu_free: int | None, mem_free: int | None) -> float:
        """Expected idle units on a node with cards ``frees`` that the workload could not use."""
        key = (frees, cpu_free, mem_free)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        idle = sum(f for f, _ in frees)
        out = 0.0
        if idle:
            for (per_card, count), members, weight in self._groups:
                slots, unit = self._slots(frees, per_card, count)
                if slots == 0:
                    out += weight * idle
                    continue
                for cpu, mem, p in members:
                    k = slots
                    if cpu and cpu_free is not None:
                        k = min(k, cpu_free // cpu)
                    if mem and mem_free is not None:
                        k = min(k, mem_free // mem)
                    out += p * (idle - min(idle, k * unit))
        if len(self._memo) >= MAX_MEMO:
            self._memo.clear()
        self._memo[key] = out
        return out


class StrandAware(Policy):
    """FGD's fragmentation change plus twice the change in stranded capacity; the card by
    stranded capacity; ties to best fit. Without a workload it learns the shapes it sees."""

    name = "strand"

    def __init__(
        self,
        shapes: Mapping[Shape, float] | Iterable[Shape] | None = None,
        strand_weight: float = STRAND_WEIGHT,
    ) -> None:
        self._learn = shapes is None
        counts: Counter[Shape] = Counter()
        if isinstance(shapes, Mapping):
            counts.update({s: float(w) for s, w in shapes.items()})
        elif shapes is not None:
            counts.update(shapes)
        self.workload = Workload(counts)
        self.strand = StrandedCapacity(counts)
        self._fgd = FragmentationGradient(self.workload)
        self._fgd.workload = self.workload  # the same object, also while it is still empty
        self.strand_weight = strand_weight

    def card_key(self, view: NodeView, card: Card, free: int, take: int) -> tuple[float, ...]:
        if not self.strand:
            return (free - take, card.index)
        return (round(card_delta(self.strand.stranded, view, card, take), 9), free - take, card.index)

    def node_key(
        self, view: NodeView, chosen: tuple[tuple[Card, int], ...], demand: Demand, take: int
    ) -> tuple[float, ...]:
        left = sum(free - take for _, free in chosen)
        if not self.strand:
            return (0.0, left, view.free_units)
        taken = {c.uuid: take for c, _ in chosen}
        strand = node_delta(self.strand.stranded, view, taken, demand.cpu_milli, demand.memory_mib)
        fgd = self._fgd.node_key(view, chosen, demand, take)[0]
        return (round(self.strand_weight * strand + fgd, 9), left, view.free_units)

    def observe(self, demand: Demand, placed: bool) -> None:
        if self._learn:
            shape = Shape.of(demand)
            self.workload.add(shape)
            self.strand.add(shape)


register_policy("strand", StrandAware)
