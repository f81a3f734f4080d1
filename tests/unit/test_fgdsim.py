"""The FGD paper simulator's scoring (core/fgdsim.py), the yardstick for the paper's figures."""

from __future__ import annotations

from gpushare_hub.core import Card, Demand, Ledger, Node, Placement, Placer
from gpushare_hub.core.fgdsim import SimulatorFGD, _score, typical_shapes
from gpushare_hub.core.fragmentation import FragmentationGradient, Shape, Workload


def test_typical_shapes_drop_memory_keep_cpu_only_pods_and_cut_at_95_percent():
    shapes = (
        [Shape(500, 1, 4000, 1024)] * 50
        + [Shape(500, 1, 4000, 2048)] * 30  # same shape once memory is dropped
        + [Shape(None, 0, 8000, 0)] * 16  # CPU-only
        + [Shape(None, 8, 64000, 0)] * 4  # the rarest 4%: cut
    )
    assert typical_shapes(shapes) == {Shape(500, 1, 4000, 0): 80 / 96, Shape(None, 0, 8000, 0): 16 / 96}


def test_score_is_an_integer_sigmoid_so_small_changes_tie():
    assert _score(0) == 50 and _score(-30) == 50 and _score(-100) == 52 and _score(1000) == 26


def node(name: str) -> Node:
    return Node(name, (Card(0, f"GPU-{name}", "T4", 1000),), cpu_milli=64_000, memory_mib=1 << 20)


def test_ties_go_to_the_first_node_name_not_to_best_fit():
    ledger = Ledger()
    for n in ("a", "b"):
        ledger.set_node(node(n))
    assert isinstance(Placer(ledger).place_and_commit(Demand("ns/held", 480, 1), ["b"]), Placement)
    shapes = [Shape(500, 1)] * 9 + [Shape(None, 0, 1000, 0)]
    small = Demand("ns/small", 10, 1)
    sim = Placer(ledger, SimulatorFGD(shapes)).decide(small)
    fgd = Placer(ledger, FragmentationGradient(Workload(shapes))).decide(small)
    assert isinstance(sim, Placement) and sim.node == "a"
    assert isinstance(fgd, Placement) and fgd.node == "b"  # best fit among equal changes
