"""The stranding-aware policy (core/stranding.py) on small hand-made nodes."""

from __future__ import annotations

from gpushare_hub.core import Card, Demand, Ledger, Node, Placement, Placer, make_policy
from gpushare_hub.core.fragmentation import FragmentationGradient, Shape, Workload
from gpushare_hub.core.policy import POLICIES
from gpushare_hub.core.stranding import StrandAware, StrandedCapacity


def node(name: str, cards: int, cpu: int | None = None, mem: int | None = None) -> Node:
    return Node(
        name,
        tuple(Card(i, f"GPU-{name}-{i}", "T4", 1000) for i in range(cards)),
        cpu_milli=cpu,
        memory_mib=mem,
    )


def ledger(*nodes: Node) -> Ledger:
    out = Ledger()
    for n in nodes:
        out.set_node(n)
    return out


ONE_CARD_12_CORES = Shape(None, 1, 12_000, 0)


def test_cpu_caps_how_many_tasks_a_node_can_still_take():
    wl = StrandedCapacity([ONE_CARD_12_CORES])
    empty_cards = ((1000, 1000), (1000, 1000))
    # 16 cores hold one 12-core task: the second card is stranded.
    assert wl.stranded(empty_cards, 16_000, None) == 1000
    assert wl.stranded(empty_cards, 32_000, None) == 0
    # Untracked CPU caps nothing; a node with no idle GPU strands nothing.
    assert wl.stranded(empty_cards, None, None) == 0
    assert wl.stranded(((0, 1000),), 0, None) == 0


def test_memory_caps_too():
    wl = StrandedCapacity([Shape(None, 1, 0, 40_000)])
    assert wl.stranded(((1000, 1000), (1000, 1000)), None, 50_000) == 1000


def test_a_sharing_shape_strands_each_cards_remainder():
    wl = StrandedCapacity([Shape(470, 1, 0, 0)])
    assert wl.stranded(((1000, 1000),), None, None) == 60  # two 470s fit, 60 left
    assert wl.stranded(((400, 1000),), None, None) == 400  # none fits


def test_whole_card_shapes_need_empty_cards():
    wl = StrandedCapacity([Shape(None, 2, 0, 0)])
    assert wl.stranded(((1000, 1000), (1000, 1000), (500, 1000)), None, None) == 500
    assert wl.stranded(((1000, 1000), (500, 1000)), None, None) == 1500


def test_shapes_are_weighted_by_how_often_they_occur():
    wl = StrandedCapacity({ONE_CARD_12_CORES: 3, Shape(None, 1, 4_000, 0): 1})
    # 16 cores, 2 empty cards: the 12-core shape strands one card, the 4-core one none.
    assert wl.stranded(((1000, 1000), (1000, 1000)), 16_000, None) == 750


def test_prefers_the_node_whose_cpu_keeps_its_cards_usable():
    # Two 4-card nodes; the workload's tasks take 1 card and 12 cores. A 20-core task on
    # the 48-core node leaves 28 cores for 3 cards (2 tasks): one card stranded. FGD sees
    # no difference (one more 12-core task fits either way) and best fit takes the first.
    shapes = [ONE_CARD_12_CORES] * 9 + [Shape(None, 1, 20_000, 0)]
    nodes = (node("a-tight", 4, cpu=48_000), node("b-roomy", 4, cpu=96_000))
    demand = Demand("ns/big-cpu", None, 1, cpu_milli=20_000)
    fgd = Placer(ledger(*nodes), FragmentationGradient(Workload(shapes))).decide(demand)
    strand = Placer(ledger(*nodes), StrandAware(shapes)).decide(demand)
    assert isinstance(fgd, Placement) and fgd.node == "a-tight"
    assert isinstance(strand, Placement) and strand.node == "b-roomy"


def test_cpu_only_pods_go_where_their_cpu_strands_no_card():
    shapes = [ONE_CARD_12_CORES]
    nodes = (node("gpu-dense", 8, cpu=96_000), node("cpu-rich", 2, cpu=104_000))
    placed = Placer(ledger(*nodes), StrandAware(shapes)).decide(Demand("ns/cpu", None, 0, cpu_milli=30_000))
    assert isinstance(placed, Placement) and placed.node == "cpu-rich"


def test_prefers_the_card_whose_leftover_the_workload_can_use():
    # Cards with 1000 and 600 free; a 300 task. Best fit takes the 600 card and leaves 300,
    # which no 350 task can use; on the 1000 card the leftovers hold three 350s.
    ld = ledger(node("n", 2))
    assert isinstance(Placer(ld).place_and_commit(Demand("ns/held", 400, 1), ["n"]), Placement)
    assert ld.state("n").used == {"GPU-n-0": 400}  # type: ignore[union-attr]
    placed = Placer(ld, StrandAware([Shape(350, 1)])).decide(Demand("ns/small", 300, 1))
    assert isinstance(placed, Placement) and placed.cards[0].index == 1
    best_fit = Placer(ld, "binpack").decide(Demand("ns/small", 300, 1))
    assert isinstance(best_fit, Placement) and best_fit.cards[0].index == 0


def _learnt_nodes() -> tuple[StrandAware, list[str]]:
    policy = make_policy("strand")
    assert isinstance(policy, StrandAware) and not policy.strand
    placer = Placer(ledger(node("a", 2, cpu=16_000), node("b", 2, cpu=64_000)), policy)
    placed = [placer.place_and_commit(Demand(f"ns/p{i}", None, 1, cpu_milli=12_000)) for i in range(3)]
    return policy, [p.node for p in placed if isinstance(p, Placement)]


def test_registered_learns_the_workload_when_none_is_given_and_is_deterministic():
    assert "strand" in POLICIES
    policy, nodes = _learnt_nodes()
    assert policy.strand and policy.workload and len(nodes) == 3
    assert _learnt_nodes()[1] == nodes
