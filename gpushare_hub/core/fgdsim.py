"""FGD scored as the FGD paper's simulator scores it: a yardstick, not a policy to run.

The paper's figures (Weng et al., ATC'23) come from its Kubernetes scheduler simulator
(hkust-adsl/kubernetes-scheduler-simulator, ``fgd_score.go``, ``pkg/utils/frag.go``), which
differs from :class:`~gpushare_hub.core.fragmentation.FragmentationGradient` in four ways:

* the target workload is the pods' (CPU, GPU) shapes *with* the CPU-only pods, no host memory,
  cut to the most frequent shapes that make up 95% of the pods, then renormalised;
* a CPU-only shape counts all of a node's idle GPU as fragment, whatever the node;
* the fragmentation change ``d`` becomes an integer score ``int(100 * sigmoid(-d / 1000))``,
  so changes within a few tens of milli-GPU tie;
* ties go to the node whose name sorts first (the simulator's patched ``selectHost``) and,
  inside a node, to the lowest card index.

``gpushare-replay --mode static --policy fgd-sim`` replays the paper's experiment this way, to
tell what in a gap to the paper's figures is the simulation and what is the policy.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping

from .cards import Card
from .demand import Demand
from .fragmentation import Shape, Workload
from .policy import NodeView, Policy, register_policy

POPULARITY_PCT = 95  # the simulator's podPopularityThreshold in the paper's runs


def typical_shapes(shapes: Iterable[Shape], popularity_pct: float = POPULARITY_PCT) -> dict[Shape, float]:
    """The simulator's typical pods: shapes without host memory, CPU-only ones included, the
    most frequent first until ``popularity_pct`` % of the pods are covered; weights sum to 1."""
    counts = Counter(Shape(s.per_card, s.count, s.cpu_milli, 0) for s in shapes)
    total = sum(counts.values())
    kept: dict[Shape, float] = {}
    covered = 0
    for shape, n in sorted(counts.items(), key=lambda sn: (-sn[1], sn[0].count, repr(sn[0]))):
        if covered >= popularity_pct * total / 100:
            break
        kept[shape] = n
        covered += n
    return {s: n / covered for s, n in kept.items()}


def _score(delta: float) -> int:
    """The simulator's node score for a fragmentation change (0..100, higher is better)."""
    return int(100 / (1 + math.exp(min(700.0, delta / 1000))))


class SimulatorFGD(Policy):
    """FGD with the paper simulator's target workload, integer score and tie-breaks."""

    name = "fgd-sim"

    def __init__(self, shapes: Iterable[Shape] | None = None) -> None:
        self._learn = shapes is None
        self._seen: Counter[Shape] = Counter(shapes or ())
        self._build()

    def _build(self) -> None:
        typical = typical_shapes(self._seen.elements())
        self.cpu_share = sum(p for s, p in typical.items() if s.count == 0)
        self.workload = Workload({s: p for s, p in typical.items() if s.count > 0})
        self._built_at = sum(self._seen.values())

    def _delta(self, view: NodeView, taken: Mapping[str, int], cpu_after: int | None) -> float:
        before = tuple((f, c.units) for c, f in view.all_cards)
        after = tuple((f - taken.get(c.uuid, 0), c.units) for c, f in view.all_cards)
        gpu = self.workload.fragmentation(after, cpu_after, None) - self.workload.fragmentation(
            before, view.cpu_free, None
        )
        # CPU-only shapes see every idle unit as fragment: that part falls by what is taken.
        return (1 - self.cpu_share) * gpu - self.cpu_share * sum(taken.values())

    def card_key(self, view: NodeView, card: Card, free: int, take: int) -> tuple[float, ...]:
        return (-_score(self._delta(view, {card.uuid: take}, view.cpu_free)), card.index)

    def node_key(
        self, view: NodeView, chosen: tuple[tuple[Card, int], ...], demand: Demand, take: int
    ) -> tuple[float, ...]:
        cpu_after = None if view.cpu_free is None else view.cpu_free - demand.cpu_milli
        return (-_score(self._delta(view, {c.uuid: take for c, _ in chosen}, cpu_after)),)

    def observe(self, demand: Demand, placed: bool) -> None:
        if self._learn:
            shape = Shape.of(demand)
            new = shape not in self._seen
            self._seen[shape] += 1
            if new or sum(self._seen.values()) > 1.05 * self._built_at:
                self._build()


register_policy("fgd-sim", SimulatorFGD)
