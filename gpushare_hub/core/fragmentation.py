"""Fragmentation-aware placement (FGD, Weng et al., USENIX ATC 2023).

A node's *fragmentation* for a workload is the GPU capacity on it that the
workload's typical tasks could not use, weighted by how often each task shape
occurs:

* a shape whose CPU or host memory does not fit the node sees every idle unit as fragment;
* a single-card shape of ``s`` units sees each card with ``0 < free < s`` as fragment;
* an ``n``-whole-cards shape sees the partly used cards as fragment if ``n`` empty
  cards remain, and all idle units otherwise.

FGD places each pod where fragmentation grows least (ties: best fit). Shapes
that ask no GPU are left out of the distribution: they never use GPU capacity.
The workload is either given (the trace being replayed, an admin's slice
profiles) or learnt from the demands the policy has seen.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .cards import Card
from .demand import Demand
from .policy import NodeView, Policy, register_policy


@dataclass(frozen=True, order=True)
class Shape:
    """A task shape: per-card units (``None`` = whole cards), card count, CPU, host memory."""

    per_card: int | None
    count: int
    cpu_milli: int = 0
    memory_mib: int = 0

    @classmethod
    def of(cls, demand: Demand) -> Shape:
        return cls(demand.per_card, demand.count, demand.cpu_milli, demand.memory_mib)


class _HostSlice:
    """The workload restricted to shapes that fit a given free CPU and memory."""

    __slots__ = ("host_fail", "sharing_sizes", "sharing_tail", "whole")

    def __init__(self, shapes: list[tuple[Shape, float]], cpu_free: int | None, mem_free: int | None) -> None:
        self.host_fail = 0.0
        sharing: dict[int, float] = {}
        whole: dict[int, float] = {}
        for shape, p in shapes:
            if (cpu_free is not None and shape.cpu_milli > cpu_free) or (
                mem_free is not None and shape.memory_mib > mem_free
            ):
                self.host_fail += p
            elif shape.per_card is None:
                whole[shape.count] = whole.get(shape.count, 0.0) + p
            elif shape.count == 1:
                sharing[shape.per_card] = sharing.get(shape.per_card, 0.0) + p
            else:
                whole[shape.count] = whole.get(shape.count, 0.0) + p  # multi-card slices: like whole cards
        self.sharing_sizes = sorted(sharing)
        # sharing_tail[i] = weight of sharing shapes with size > sharing_sizes[i-1]
        tail = [0.0] * (len(self.sharing_sizes) + 1)
        for i in range(len(self.sharing_sizes) - 1, -1, -1):
            tail[i] = tail[i + 1] + sharing[self.sharing_sizes[i]]
        self.sharing_tail = tail
        self.whole = sorted(whole.items())

    def weight_larger_than(self, free: int) -> float:
        """Weight of single-card shapes asking more than ``free`` units."""
        return self.sharing_tail[bisect_right(self.sharing_sizes, free)]


class Workload:
    """A distribution over task shapes, normalised to weights summing to 1."""

    def __init__(self, shapes: Mapping[Shape, float] | Iterable[Shape] = ()) -> None:
        counts: Counter[Shape] = Counter()
        if isinstance(shapes, Mapping):
            counts.update({s: float(w) for s, w in shapes.items()})
        else:
            counts.update(shapes)
        self._counts = Counter({s: w for s, w in counts.items() if s.count > 0 and w > 0})
        self._freeze()

    def _freeze(self) -> None:
        total = sum(self._counts.values()) or 1.0
        self._frozen_total = total
        self._shapes = sorted(((s, w / total) for s, w in self._counts.items()), key=lambda sw: repr(sw[0]))
        self._hosts: dict[tuple[int | None, int | None], _HostSlice] = {}
        self._frag: dict[tuple[object, ...], float] = {}

    def add(self, shape: Shape) -> None:
        """Count one more task of ``shape``. Weights are refreshed when a new shape
        appears or the count grew by 5%, so that memoised figures stay useful."""
        if shape.count <= 0:
            return
        new = shape not in self._counts
        self._counts[shape] += 1
        if new or sum(self._counts.values()) > 1.05 * self._frozen_total:
            self._freeze()

    def __bool__(self) -> bool:
        return bool(self._shapes)

    def _host(self, cpu_free: int | None, mem_free: int | None) -> _HostSlice:
        key = (cpu_free, mem_free)
        hs = self._hosts.get(key)
        if hs is None:
            hs = self._hosts[key] = _HostSlice(self._shapes, cpu_free, mem_free)
        return hs

    def fragmentation(
        self, frees: tuple[tuple[int, int], ...], cpu_free: int | None, mem_free: int | None
    ) -> float:
        """Expected unusable units on a node whose cards have (free, size) pairs ``frees``."""
        key = (frees, cpu_free, mem_free)
        hit = self._frag.get(key)
        if hit is not None:
            return hit
        hs = self._host(cpu_free, mem_free)
        idle = sum(f for f, _ in frees)
        frag = hs.host_fail * idle
        for f, _ in frees:
            if f:
                frag += f * hs.weight_larger_than(f)
        if hs.whole:
            empty = sum(1 for f, size in frees if f == size)
            partial = sum(f for f, size in frees if f != size)
            for n, p in hs.whole:
                frag += p * (partial if empty >= n else idle)
        self._frag[key] = frag
        return frag


# A measure of a node's unusable GPU: (free, size) per card, free CPU, free memory -> units.
Measure = Callable[[tuple[tuple[int, int], ...], int | None, int | None], float]


def node_delta(measure: Measure, view: NodeView, taken: Mapping[str, int], cpu: int, mem: int) -> float:
    """How much ``measure`` grows on the node when ``taken`` units (by card UUID), ``cpu``
    millicores and ``mem`` MiB of host memory are placed there."""
    before = tuple((f, c.units) for c, f in view.all_cards)
    after = tuple((f - taken.get(c.uuid, 0), c.units) for c, f in view.all_cards)
    cpu_after = None if view.cpu_free is None else view.cpu_free - cpu
    mem_after = None if view.memory_free is None else view.memory_free - mem
    return measure(after, cpu_after, mem_after) - measure(before, view.cpu_free, view.memory_free)


def card_delta(measure: Measure, view: NodeView, card: Card, take: int) -> float:
    """How much ``measure`` grows (GPU only) when ``take`` units go on ``card`` of the node."""
    frees = tuple((f, c.units) for c, f in view.all_cards)
    after = tuple(
        (f - take, s) if c.uuid == card.uuid else (f, s)
        for (c, _), (f, s) in zip(view.all_cards, frees, strict=True)
    )
    return measure(after, None, None) - measure(frees, None, None)


class FragmentationGradient(Policy):
    """Place where the node's fragmentation grows least; ties go to best fit."""

    name = "fgd"

    def __init__(self, workload: Workload | None = None) -> None:
        self.workload = workload or Workload()
        self._learn = workload is None

    def _delta(self, view: NodeView, taken: Mapping[str, int], demand: Demand) -> float:
        return node_delta(self.workload.fragmentation, view, taken, demand.cpu_milli, demand.memory_mib)

    def card_key(self, view: NodeView, card: Card, free: int, take: int) -> tuple[float, ...]:
        if not self.workload:
            return (free - take, card.index)
        return (round(card_delta(self.workload.fragmentation, view, card, take), 9), free - take, card.index)

    def node_key(
        self, view: NodeView, chosen: tuple[tuple[Card, int], ...], demand: Demand, take: int
    ) -> tuple[float, ...]:
        left = sum(free - take for _, free in chosen)
        if not self.workload:
            return (0.0, left, view.free_units)
        taken = {c.uuid: take for c, _ in chosen}
        return (round(self._delta(view, taken, demand), 9), left, view.free_units)

    def observe(self, demand: Demand, placed: bool) -> None:
        if self._learn:
            self.workload.add(Shape.of(demand))


register_policy("fgd", FragmentationGradient)
