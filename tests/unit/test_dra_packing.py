"""The DRA policies (core/drapacking.py) on hand-built clusters, and ``gpushare-replay
--compare-dra`` computed from real small replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpushare_hub.core.annotations import CardShare
from gpushare_hub.core.cards import Card, Node
from gpushare_hub.core.demand import Demand
from gpushare_hub.core.drapacking import (
    DRA_POLICIES,
    HostCapacity,
    default_node_score,
    make_dra_policy,
)
from gpushare_hub.core.ledger import Ledger, Placement
from gpushare_hub.core.policy import Placer
from gpushare_hub.core.resources import ResourceNames
from gpushare_hub.replay.cli import main
from gpushare_hub.replay.compare import COMPARED

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
CAP = HostCapacity(cpu_milli=100_000, memory_mib=100_000)


def cluster(*names: str, cards: int = 2, units: int = 15) -> Ledger:
    ledger = Ledger(ResourceNames(unit="slices"))
    for name in names:
        ledger.set_node(
            Node(
                name=name,
                cards=tuple(Card(i, f"GPU-{name}-{i}", "Tesla-T4", units) for i in range(cards)),
            )
        )
    return ledger


def hold(ledger: Ledger, key: str, node: str, index: int, units: int, cpu: int = 0, memory: int = 0) -> None:
    """A pod holding ``units`` on card ``index`` of ``node``, with CPU and memory requests."""
    card = next(c for c in ledger.state(node).node.cards if c.index == index)  # type: ignore[union-attr]
    ledger.commit(
        Placement(
            key=key,
            node=node,
            cards=(CardShare(uuid=card.uuid, index=index, units=units),),
            cpu_milli=cpu,
            memory_mib=memory,
        )
    )


def place(ledger: Ledger, policy: str, units: int, cpu: int = 1000, memory: int = 1024, hosts=None):
    placer = Placer(ledger, make_dra_policy(policy, ledger, hosts or {n: CAP for n in ledger.states()}))
    got = placer.decide(Demand(key="new", per_card=units, count=1, cpu_milli=cpu, memory_mib=memory))
    assert isinstance(got, Placement), got
    return got.node, got.cards[0].index


# ---- the card inside the node -------------------------------------------------------------------
def test_first_fit_takes_the_first_card_in_index_order_that_holds_the_slice():
    ledger = cluster("a")
    hold(ledger, "x", "a", 0, 5)  # card 0: 10 free
    hold(ledger, "y", "a", 1, 11)  # card 1: 4 free, the fuller
    assert place(ledger, "dra-first-fit", 3) == ("a", 0)
    hold(ledger, "z", "a", 0, 8)  # card 0: 2 free, too little for 3
    assert place(ledger, "dra-first-fit", 3) == ("a", 1)


@pytest.mark.parametrize("policy", ["dra-ordered", "dra-ordered-mostallocated", "dra-ordered-binpack"])
def test_ordered_devices_take_the_fullest_card_that_holds_the_slice(policy):
    ledger = cluster("a", cards=3)
    hold(ledger, "x", "a", 0, 5)  # 10 free
    hold(ledger, "y", "a", 1, 11)  # 4 free
    hold(ledger, "w", "a", 2, 13)  # 2 free: the fullest, too small for 3
    assert place(ledger, policy, 3) == ("a", 1)
    assert place(ledger, policy, 2) == ("a", 2)
    assert place(ledger, policy, 5) == ("a", 0)


def test_whole_cards_go_to_the_first_empty_cards():
    ledger = cluster("a", cards=3)
    hold(ledger, "x", "a", 0, 5)
    placer = Placer(ledger, make_dra_policy("dra-ordered", ledger))
    got = placer.decide(Demand(key="new", per_card=None, count=1))
    assert isinstance(got, Placement) and got.cards[0].index == 1


# ---- the node ------------------------------------------------------------------------------------
def test_the_default_score_is_least_allocated_plus_balanced_in_integers():
    # CPU 25% and memory 50% requested: least-allocated (75 + 50) // 2 = 62; balanced: the
    # standard deviation of 0.25 and 0.5 is 0.125, int((1 - 0.125) * 100) = 87.
    assert default_node_score(25_000, 50_000, CAP) == 62 + 87
    # most-allocated: (25 + 50) // 2 = 37, the same balance.
    assert default_node_score(25_000, 50_000, CAP, most=True) == 37 + 87
    # Beyond the capacity a resource scores 0 (least) or 100 (most); the fraction counts as 1.
    assert default_node_score(200_000, 0, CAP) == 50 + 50
    assert default_node_score(200_000, 0, CAP, most=True) == 50 + 50


@pytest.mark.parametrize("policy", ["dra-first-fit", "dra-ordered"])
def test_the_default_node_choice_spreads_on_cpu_and_memory_whatever_the_cards(policy):
    ledger = cluster("a", "b")
    hold(ledger, "x", "a", 0, 12, cpu=40_000, memory=40_000)  # a: a fuller card, more CPU used
    hold(ledger, "y", "b", 0, 1, cpu=10_000, memory=10_000)
    assert place(ledger, policy, 3)[0] == "b"
    # binpack would take a's fuller card
    assert Placer(ledger, "binpack").decide(Demand(key="new", per_card=3, count=1)).node == "a"  # type: ignore[union-attr]


def test_equal_scores_fall_to_the_node_name():
    ledger = cluster("b", "a", "c")
    assert place(ledger, "dra-first-fit", 3)[0] == "a"


def test_node_capacities_come_from_the_nodes_then_the_given_hosts():
    ledger = cluster("a", "b")
    hold(ledger, "x", "a", 0, 1, cpu=20_000, memory=20_000)
    hold(ledger, "y", "b", 0, 1, cpu=20_000, memory=20_000)
    # The same requests; b is twice as large, so less allocated.
    hosts = {"a": CAP, "b": HostCapacity(200_000, 200_000)}
    assert place(ledger, "dra-first-fit", 3, hosts=hosts)[0] == "b"
    assert place(ledger, "dra-ordered-mostallocated", 3, hosts=hosts)[0] == "a"
    # A node that tracks its own CPU and memory is read from itself.
    big = Node(name="a", cards=ledger.state("a").node.cards, cpu_milli=400_000, memory_mib=400_000)  # type: ignore[union-attr]
    ledger.set_node(big)
    assert place(ledger, "dra-first-fit", 3, hosts=hosts)[0] == "a"


def test_ordered_binpack_ranks_nodes_as_binpack_then_by_the_default_score():
    ledger = cluster("a", "b", "c")
    hold(ledger, "x", "a", 0, 12, cpu=60_000, memory=60_000)  # the fullest card, the busiest host
    hold(ledger, "y", "b", 0, 6)
    assert place(ledger, "dra-ordered-binpack", 3) == ("a", 0)
    # b and c tie for binpack on a 15-slice pod (a whole empty card each, nodes as full);
    # the default score breaks it: c's host is emptier.
    ledger2 = cluster("a", "b", "c")
    hold(ledger2, "x", "b", 0, 1, cpu=50_000, memory=50_000)
    hold(ledger2, "y", "c", 0, 1, cpu=10_000, memory=10_000)
    hold(ledger2, "z", "a", 0, 15)
    hold(ledger2, "w", "a", 1, 1)
    assert place(ledger2, "dra-ordered-binpack", 15)[0] == "c"


def test_an_unknown_dra_policy_is_refused_with_the_names():
    with pytest.raises(ValueError, match="dra-first-fit"):
        make_dra_policy("dra-best", cluster("a"))


# ---- the replayer -------------------------------------------------------------------------------
def trace(tmp: Path) -> str:
    # Five 3-slice pods, one after another, all staying: binpack fills one card; the default
    # node choice puts each on the emptiest node.
    rows = [f"p{i},4000,8192,1,200,,LS,Running,{i},1000," for i in range(5)]
    path = tmp / "pods.csv"
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    return str(path)


def replay_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_compare_dra_has_every_policys_row_from_its_own_replay(tmp_path, capsys):
    pods = trace(tmp_path)
    out = replay_json(capsys, "--compare-dra", "--pods", pods, "--cards", "4x2 T4")
    assert [r["policy"] for r in out["rows"]] == list(COMPARED) == ["binpack", *DRA_POLICIES]
    for row in out["rows"]:
        alone = replay_json(capsys, "--policy", row["policy"], "--pods", pods, "--cards", "4x2 T4")
        for key in ("peak_cards", "peak_lower_bound", "peak_ratio", "card_hours_ratio", "failed_pods"):
            assert row[key] == alone[key], (row["policy"], key)
    peaks = {r["policy"]: r["peak_cards"] for r in out["rows"]}
    assert peaks["binpack"] == 1 and peaks["dra-first-fit"] == 4 and peaks["dra-ordered-binpack"] == 1
    assert main(["--compare-dra", "--pods", pods, "--cards", "4x2 T4"]) == 0
    text = capsys.readouterr().out
    for row in out["rows"]:
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(row["policy"] + " "))
        assert str(row["peak_cards"]) in line.split() and f"{row['peak_ratio']:.3f}" in line


def test_a_dra_policy_runs_in_static_mode_on_the_nodes_own_capacity(tmp_path, capsys):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,8000,65536,2,T4\nn1,8000,65536,2,T4\n")
    rows = [f"p{i},6000,1024,1,1000,,LS,Running,0,1," for i in range(4)]
    path = tmp_path / "pods.csv"
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    out = replay_json(
        capsys, "--mode", "static", "--policy", "dra-first-fit", "--pods", str(path), "--nodes", str(nodes)
    )
    assert out["policy"] == "dra-first-fit" and out["unallocated_gpu_pct_at_100"] == 50.0


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--mode", "static"], "leave out --mode static"),
        (["--policy", "spread"], "leave out --policy"),
        (["--plot", "x.png"], "leave it out with --compare-dra"),
        (["--history", "h.csv"], "leave them out with --history"),
    ],
)
def test_compare_dra_refuses_what_it_cannot_honour(tmp_path, capsys, extra, words):
    argv = ["--compare-dra", "--pods", trace(tmp_path), *extra]
    if "--plot" in extra:
        argv[-1] = str(tmp_path / "x.png")
    assert main(argv) == 2
    assert words in capsys.readouterr().err
