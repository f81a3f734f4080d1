"""The ledger (rebuild, watch events, over-commit guard) and the placement policies."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpushare_hub.core import (
    CardShare,
    Demand,
    Ignored,
    IgnoredRecord,
    Ledger,
    Node,
    OverCommit,
    Placement,
    Placer,
    Refusal,
    declared_cards,
    demand_from_pod,
)
from gpushare_hub.core.names import ALLOCATION_ANNOTATION, GPU_MEM_ASSIGNED, GPU_MEM_IDX, GPU_MEM_POD
from gpushare_hub.core.verdict import Kind, Reason, explain
from tests.objects import read_node, read_nodes, read_pod, read_pods
from tests.support.extender_calls import annotated

from .helpers import node_obj, pod_obj


def cluster(*nodes: tuple[str, int], model: str = "Tesla T4", mib: int = 15360) -> Ledger:
    ledger = Ledger()
    for name, cards in nodes:
        ledger.set_node(Node(name, declared_cards(name, cards, model, mib)))
    return ledger


def place(placer: Placer, key: str, units: int, **kw) -> Placement:
    result = placer.place_and_commit(Demand(key=key, per_card=units, count=1, **kw))
    assert isinstance(result, Placement), getattr(result, "reason", result)
    return result


def test_seed_scenario_three_small_pods_share_one_card_under_binpack():
    ledger = cluster(("gpu-1", 2), ("gpu-2", 2), ("gpu-3", 2))
    placer = Placer(ledger, "binpack")
    got = [place(placer, f"jhub/p{i}", 1) for i in range(3)]
    assert {(p.node, p.cards[0].index) for p in got} == {("gpu-1", 0)}
    assert ledger.used("gpu-1", got[0].cards[0].uuid) == 3


def test_binpack_takes_the_fullest_card_that_fits_and_spread_the_emptiest():
    ledger = cluster(("gpu-1", 2), ("gpu-2", 2))
    placer = Placer(ledger, "binpack")
    place(placer, "a/x", 10)  # gpu-1 card 0: 5 left
    place(placer, "a/y", 12)  # gpu-1 card 1: 3 left
    assert place(placer, "a/z", 3).cards[0].index == 1  # exact fit beats the emptier card
    spread = Placer(cluster(("gpu-1", 2), ("gpu-2", 2)), "spread")
    nodes = [place(spread, f"a/s{i}", 3).node for i in range(4)]
    assert sorted(nodes) == ["gpu-1", "gpu-1", "gpu-2", "gpu-2"]  # one pod per card first


def test_binpack_fills_a_node_before_starting_the_next():
    placer = Placer(cluster(("gpu-1", 2), ("gpu-2", 2)), "binpack")
    nodes = [place(placer, f"a/p{i}", 15).node for i in range(3)]
    assert nodes == ["gpu-1", "gpu-1", "gpu-2"]


def test_refusal_names_the_largest_free_block_and_waits():
    ledger = cluster(("gpu-1", 2), ("gpu-2", 2))
    placer = Placer(ledger, "binpack")
    for i, units in enumerate([10, 10, 10, 13]):
        place(placer, f"a/f{i}", units)
    r = placer.decide(Demand(key="a/big", per_card=7, count=1, models=("Tesla-T4",)))
    assert isinstance(r, Refusal) and not r.permanent
    assert r.reason.startswith(
        "no Tesla-T4 card has 7 GiB free; the largest free block is 5 GiB (node gpu-1, card 0)"
    )
    assert set(r.nodes) == {"gpu-1", "gpu-2"}


def test_request_larger_than_any_card_is_refused_for_good():
    placer = Placer(cluster(("gpu-1", 2)), "binpack")
    r = placer.decide(Demand(key="a/huge", per_card=20, count=1))
    assert isinstance(r, Refusal) and r.permanent
    assert "largest card holds 15 GiB" in r.reason and "ask for at most 15 GiB" in r.reason
    assert set(r.unresolvable) == {"gpu-1"}


def test_total_free_suffices_but_no_single_card_does():
    ledger = cluster(("gpu-1", 2))
    placer = Placer(ledger, "binpack")
    place(placer, "a/x", 9)
    place(placer, "a/y", 9)
    r = placer.decide(Demand(key="a/z", per_card=10, count=1))
    assert isinstance(r, Refusal) and not r.permanent and "largest free block is 6 GiB" in r.reason


def test_card_model_constraint_and_missing_model():
    ledger = cluster(("t4", 1))
    ledger.set_node(Node("a10", declared_cards("a10", 1, "A10", 23028)))
    placer = Placer(ledger, "binpack")
    assert place(placer, "a/x", 3, models=("A10",)).node == "a10"
    assert place(placer, "a/y", 3, exclude_models=("A10",)).node == "t4"
    r = placer.decide(Demand(key="a/z", per_card=3, count=1, models=("A100",)))
    assert isinstance(r, Refusal) and r.permanent and "no A100 card" in r.reason


def test_whole_and_multi_card_demands_stay_on_one_node():
    ledger = cluster(("gpu-1", 2), ("gpu-2", 4))
    placer = Placer(ledger, "binpack")
    place(placer, "a/small", 2)  # gpu-1 card 0 is no longer empty
    whole = placer.place_and_commit(Demand(key="a/w", per_card=None, count=2))
    assert isinstance(whole, Placement) and whole.node == "gpu-2" and len(whole.cards) == 2
    assert all(c.units == 15 for c in whole.cards)
    multi = placer.place_and_commit(Demand(key="a/m", per_card=4, count=2))
    assert isinstance(multi, Placement) and len({c.uuid for c in multi.cards}) == 2


def test_prioritize_scores_are_0_to_10_with_the_policy_favourite_at_10():
    ledger = cluster(("gpu-1", 1), ("gpu-2", 1), ("gpu-3", 1))
    placer = Placer(ledger, "binpack")
    place(placer, "a/x", 10)  # gpu-1
    place(placer, "a/y", 5)  # gpu-1 full now
    place(placer, "a/z", 6)  # gpu-2
    scores = placer.scores(Demand(key="a/n", per_card=3, count=1), ["gpu-1", "gpu-2", "gpu-3"])
    assert scores == {"gpu-2": 10, "gpu-3": 0}


def test_commit_never_overcommits_a_card():
    ledger = cluster(("gpu-1", 1))
    uuid = next(ledger.nodes()).cards[0].uuid
    ledger.commit(Placement("a/x", "gpu-1", (CardShare(uuid, 0, 10),)))
    with pytest.raises(OverCommit, match="5 units free, 6 asked"):
        ledger.commit(Placement("a/y", "gpu-1", (CardShare(uuid, 0, 6),)))


def test_ledger_rebuilt_from_annotations_equals_the_one_built_step_by_step():
    ledger = Ledger.from_objects(read_nodes([node_obj("gpu-1"), node_obj("gpu-2")]), read_pods([]))
    placer = Placer(ledger)
    placed = [place(placer, f"jhub/p{i}", u) for i, u in enumerate([5, 3, 7, 15, 2])]
    rebuilt = Ledger.from_objects(
        read_nodes([node_obj("gpu-1"), node_obj("gpu-2")]), read_pods([annotated(p) for p in placed])
    )
    assert rebuilt.equivalent(ledger)
    assert rebuilt.allocation("jhub/p0").containers == ()  # no containers recorded for bare demands


def test_pods_placed_by_old_gpushare_are_read_through_card_indices():
    node = node_obj("gpu-1")
    pod = pod_obj(
        "legacy",
        4,
        node="gpu-1",
        phase="Running",
        annotations={GPU_MEM_IDX: "1", GPU_MEM_POD: "4", GPU_MEM_ASSIGNED: "true"},
    )
    ledger = Ledger.from_objects(read_nodes([node]), read_pods([pod]))
    alloc = ledger.allocation("jhub/legacy")
    assert alloc is not None and alloc.cards[0].uuid == "GPU-sim-gpu-1-1" and alloc.assigned


def test_a_stale_watch_event_does_not_drop_what_we_just_placed():
    ledger = Ledger.from_objects(read_nodes([node_obj("gpu-1")]), read_pods([]))
    placer = Placer(ledger)
    demand = demand_from_pod(read_pod(pod_obj("nb", 5)))
    p = placer.place_and_commit(demand)
    assert isinstance(p, Placement)
    ledger.observe_pod(read_pod(pod_obj("nb", 5)))  # the event from before our annotations
    assert ledger.allocation("jhub/nb") is not None
    ledger.observe_pod(read_pod(annotated(p)))  # now seen with annotations: confirmed
    assert not ledger.allocation("jhub/nb").assumed
    ledger.observe_pod(
        read_pod(pod_obj("nb", 5, uid="another-uid")), deleted=True
    )  # a different pod of that name
    assert ledger.allocation("jhub/nb") is not None
    finished = annotated(p)
    finished["status"]["phase"] = "Succeeded"
    ledger.observe_pod(read_pod(finished))
    assert ledger.allocation("jhub/nb") is None
    assert ledger.totals() == (0, 30)


def test_unreadable_allocation_annotation_is_ignored_with_the_way_out():
    pod = pod_obj("t", 5, node="gpu-1", annotations={ALLOCATION_ANNOTATION: '{"node": 1}'})
    ledger = Ledger.from_objects(read_nodes([node_obj("gpu-1")]), read_pods([]))
    got = ledger.observe_pod(read_pod(pod))
    assert isinstance(got, IgnoredRecord) and got.reason is Ignored.UNREADABLE
    assert "not a valid allocation record" in got.message() and "Remove the annotation" in got.message()
    assert ledger.allocations() == [] and ledger.ignored() == [got]


def test_two_legacy_records_on_one_card_count_the_first_and_ignore_the_second():
    node = node_obj("gpu-1", cards=1)
    pods = [
        pod_obj(f"p{i}", 10, node="gpu-1", phase="Running", annotations={GPU_MEM_IDX: "0", GPU_MEM_POD: "10"})
        for i in range(2)
    ]
    ledger = Ledger.from_objects(read_nodes([node]), read_pods(pods))
    assert ledger.overcommitted() == []
    assert ledger.used("gpu-1", "GPU-sim-gpu-1-0") == 10
    (ignored,) = ledger.ignored()
    assert (ignored.key, ignored.reason) == ("jhub/p1", Ignored.CARD_FULL)
    assert "has 5 of 15 units not held by other pods, the record claims 10" in ignored.message()
    ledger.observe_pod(read_pod(pods[0]), deleted=True)  # the card frees up: the second record counts now
    assert ledger.allocation("jhub/p1") is not None and ledger.ignored() == []


def forged(
    name: str, mem: int | None, *, node: str | None, units: int, uuid: str = "GPU-sim-gpu-1-0"
) -> dict:
    record = (
        f'{{"v":1,"node":"gpu-1","cards":[{{"uuid":"{uuid}","index":0,"units":{units}}}],"containers":[]}}'
    )
    return pod_obj(name, mem, node=node, phase="Running", annotations={ALLOCATION_ANNOTATION: record})


@pytest.mark.parametrize(
    ("pod", "reason", "says"),
    [
        (forged("idle", None, node=None, units=15), Ignored.NO_DEMAND, "asks for no aliyun.com/gpu-mem"),
        (forged("unbound", 15, node=None, units=15), Ignored.NOT_BOUND, "not bound to a node"),
        (forged("elsewhere", 15, node="gpu-2", units=15), Ignored.WRONG_NODE, "bound to gpu-2"),
        (forged("negative", 5, node="gpu-1", units=-10), Ignored.WRONG_AMOUNT, "a share is at least 1"),
        (forged("more", 5, node="gpu-1", units=15), Ignored.WRONG_AMOUNT, "the pod asks 5 GiB on one card"),
        (forged("huge", 99, node="gpu-1", units=99), Ignored.WRONG_AMOUNT, "has 15 units"),
        (forged("nocard", 5, node="gpu-1", units=5, uuid="GPU-x"), Ignored.UNKNOWN_CARD, "no card GPU-x"),
        (
            pod_obj("legacy", None, node="gpu-1", annotations={GPU_MEM_IDX: "0", GPU_MEM_POD: "15"}),
            Ignored.NO_DEMAND,
            "ALIYUN_COM_GPU_MEM_IDX/ALIYUN_COM_GPU_MEM_POD is set but the pod asks for no",
        ),
    ],
    ids=lambda v: v["metadata"]["name"] if isinstance(v, dict) else None,
)
def test_forged_allocation_records_hold_no_card(pod, reason, says):
    ledger = Ledger.from_objects(read_nodes([node_obj("gpu-1"), node_obj("gpu-2")]), read_pods([]))
    got = ledger.observe_pod(read_pod(pod))
    assert isinstance(got, IgnoredRecord) and got.reason is reason, got
    assert says in got.message()
    assert ledger.totals() == (0, 60) and ledger.allocations() == []
    # and the cards still take what they really hold, never more
    placer = Placer(ledger)
    for i in range(4):
        place(placer, f"jhub/real{i}", 15)
    assert ledger.overcommitted() == [] and ledger.totals() == (60, 60)


def test_record_for_a_node_not_yet_known_is_checked_when_the_node_arrives():
    ledger = Ledger()
    assert ledger.observe_pod(read_pod(forged("early", 5, node="gpu-1", units=5, uuid="GPU-x"))) is None
    (ignored,) = ledger.observe_node(read_node(node_obj("gpu-1")))
    assert ignored.reason is Ignored.UNKNOWN_CARD and ledger.allocations() == []


def test_snapshot_lists_every_card_with_its_pods():
    ledger = Ledger.from_objects(read_nodes([node_obj("gpu-1")]), read_pods([]))
    place(Placer(ledger), "jhub/alice", 5)
    snap = ledger.snapshot()
    card = snap["nodes"][0]["cards"][0]
    assert (card["used"], card["free"], card["pods"][0]["pod"]) == (5, 10, "jhub/alice")
    assert (snap["used"], snap["total"], snap["unit"]) == (5, 30, "GiB")


def test_a_pod_with_an_init_container_asking_too_is_read_back_as_placed():
    init = [{"name": "warmup", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]
    pod = pod_obj("nb", 4, init=init)
    ledger = Ledger.from_objects(read_nodes([node_obj("gpu-1")]), read_pods([]))
    placed = Placer(ledger).place_and_commit(demand_from_pod(read_pod(pod)))
    assert isinstance(placed, Placement) and len(placed.containers) == 2
    ann = placed.record().pod_annotations({c.uuid: 15 for c in placed.cards}, assume_time_ns=1)
    seen = pod_obj("nb", 4, init=init, node="gpu-1", annotations=ann, phase="Running")
    assert (
        Ledger.from_objects(read_nodes([node_obj("gpu-1")]), read_pods([seen])).allocation("jhub/nb")
        is not None
    )


# ---- verdicts: values for code, words made once for people ------------------------------------
def verdict_ledger() -> Ledger:
    """gpu-1: two 15 GiB T4s holding 9 and 10 GiB; gpu-sick: every card unhealthy; gpu-cpu:
    4000m CPU, 1000m of it held; gpu-mem: 8000 MiB memory, 7000 of it held; gpu-one: one card."""
    ledger = cluster(("gpu-1", 2), ("gpu-one", 1))
    sick = tuple(replace(c, healthy=False) for c in declared_cards("gpu-sick", 2, "Tesla T4", 15360))
    ledger.set_node(Node("gpu-sick", sick))
    ledger.set_node(Node("gpu-cpu", declared_cards("gpu-cpu", 2, "Tesla T4", 15360), cpu_milli=4000))
    ledger.set_node(Node("gpu-mem", declared_cards("gpu-mem", 2, "Tesla T4", 15360), memory_mib=8000))
    ledger.mark_unreadable("gpu-bad", "the cards annotation is not JSON")
    placer = Placer(ledger)
    for key, units, node in [("a/x", 9, "gpu-1"), ("a/y", 10, "gpu-1")]:
        assert isinstance(
            placer.place_and_commit(Demand(key=key, per_card=units, count=1), [node]), Placement
        )
    placer.place_and_commit(Demand(key="a/c", per_card=1, count=1, cpu_milli=1000), ["gpu-cpu"])
    placer.place_and_commit(Demand(key="a/m", per_card=1, count=1, memory_mib=7000), ["gpu-mem"])
    return ledger


@pytest.mark.parametrize(
    ("node", "demand", "kind", "reason", "fields", "words"),
    [
        (
            "gpu-1",
            dict(per_card=10, count=1),
            Kind.NOT_NOW,
            Reason.NO_ROOM,
            dict(have=0, asked=1, free=6, card=0),
            "no card on node gpu-1 has 10 GiB free; the largest free block is 6 GiB (card 0)",
        ),
        (
            "gpu-1",
            dict(per_card=10, count=1, models=("Tesla-T4",)),
            Kind.NOT_NOW,
            Reason.NO_ROOM,
            dict(free=6, card=0),
            "no Tesla-T4 card on node gpu-1 has 10 GiB free; the largest free block is 6 GiB (card 0)",
        ),
        (
            "gpu-1",
            dict(per_card=6, count=2),
            Kind.NOT_NOW,
            Reason.NO_ROOM,
            dict(have=1, asked=2),
            "node gpu-1 has 1 card(s) with 6 GiB free, the pod asks 2",
        ),
        (
            "gpu-1",
            dict(per_card=16, count=1),
            Kind.NEVER,
            Reason.TOO_BIG,
            dict(have=15, asked=16),
            "cards on node gpu-1 hold at most 15 GiB, the pod asks 16 GiB on one card",
        ),
        (
            "gpu-1",
            dict(per_card=3, count=1, models=("A10",)),
            Kind.NEVER,
            Reason.MODEL,
            dict(models=("Tesla-T4",)),
            "node gpu-1 has no card of an allowed model (it has Tesla-T4)",
        ),
        (
            "gpu-one",
            dict(per_card=3, count=2),
            Kind.NEVER,
            Reason.TOO_FEW_CARDS,
            dict(have=1, asked=2),
            "node gpu-one has 1 usable card(s), the pod asks 2",
        ),
        (
            "gpu-1",
            dict(per_card=None, count=1),
            Kind.NOT_NOW,
            Reason.NO_EMPTY_CARDS,
            dict(have=0, asked=1),
            "node gpu-1 has 0 empty card(s), the pod asks 1 whole card(s)",
        ),
        (
            "gpu-sick",
            dict(per_card=3, count=1),
            Kind.NOT_NOW,
            Reason.UNHEALTHY,
            {},
            "node gpu-sick: every card is unhealthy",
        ),
        (
            "gpu-cpu",
            dict(per_card=3, count=1, cpu_milli=4000),
            Kind.NOT_NOW,
            Reason.CPU,
            dict(have=3000, asked=4000),
            "node gpu-cpu has 3000m CPU free, the pod asks 4000m",
        ),
        (
            "gpu-cpu",
            dict(per_card=3, count=1, cpu_milli=5000),
            Kind.NEVER,
            Reason.CPU,
            dict(have=4000, asked=5000),
            "node gpu-cpu has 4000m CPU, the pod asks 5000m",
        ),
        (
            "gpu-mem",
            dict(per_card=3, count=1, memory_mib=2000),
            Kind.NOT_NOW,
            Reason.MEMORY,
            dict(have=1000, asked=2000),
            "node gpu-mem has 1000 MiB memory free, the pod asks 2000 MiB",
        ),
        (
            "gpu-mem",
            dict(per_card=3, count=1, memory_mib=9000),
            Kind.NEVER,
            Reason.MEMORY,
            dict(have=8000, asked=9000),
            "node gpu-mem has 8000 MiB memory, the pod asks 9000 MiB",
        ),
        (
            "gpu-bad",
            dict(per_card=3, count=1),
            Kind.NEVER,
            Reason.UNREADABLE,
            dict(detail="the cards annotation is not JSON"),
            "node gpu-bad: its card inventory is unreadable, so nothing is placed there "
            "(the cards annotation is not JSON)",
        ),
        (
            "gpu-9",
            dict(per_card=3, count=1),
            Kind.NEVER,
            Reason.NO_CARDS,
            {},
            "node gpu-9 offers no aliyun.com/gpu-mem (no GPU-sharing cards known)",
        ),
    ],
)
def test_each_nodes_verdict_is_a_value_and_its_words_are_the_ones_the_docs_quote(
    node, demand, kind, reason, fields, words
):
    d = Demand(key="jhub/p", **demand)
    placer = Placer(verdict_ledger())
    v = placer.verdict(node, d)
    assert (v.node, v.kind, v.reason) == (node, kind, reason)
    assert {k: getattr(v, k) for k in fields} == fields
    assert not v.transient and not v.feasible
    assert explain(v, d, placer.names) == words
    _, not_now, never = placer.candidates(d, [node])
    assert (not_now if kind is Kind.NOT_NOW else never) == {node: v}


def test_a_feasible_verdict_carries_the_rank_and_the_chosen_cards():
    placer = Placer(verdict_ledger())
    d = Demand(key="jhub/p", per_card=5, count=1)
    v = placer.verdict("gpu-1", d)
    assert v.feasible and v.reason is None and [(c.index, free) for c, free in v.chosen] == [(1, 5)]
    assert v.rank == placer.policy.node_key(placer._view(placer.ledger.state("gpu-1"), d), v.chosen, d, 5)
    assert explain(v, d, placer.names) == "node gpu-1 can hold 5 GiB on one card"
    assert placer.verdict("gpu-1", Demand(key="jhub/q", per_card=None, count=0)).feasible  # no GPU asked


def test_an_unhealthy_card_is_named_after_the_reason_it_adds_to():
    ledger = Ledger()
    cards = declared_cards("gpu-1", 2, "Tesla T4", 15360)
    ledger.set_node(Node("gpu-1", (cards[0], replace(cards[1], healthy=False))))
    placer = Placer(ledger)
    place(placer, "a/x", 12)
    d = Demand(key="jhub/p", per_card=5, count=1)
    v = placer.verdict("gpu-1", d)
    assert (v.reason, v.cards, v.free, v.card) == (Reason.NO_ROOM, (1,), 3, 0)
    assert explain(v, d, placer.names) == (
        "no card on node gpu-1 has 5 GiB free; the largest free block is 3 GiB (card 0); "
        "card 1 is unhealthy and not used"
    )


def test_a_refusal_carries_each_nodes_verdict_and_the_summary_switches_on_their_reasons():
    placer = Placer(verdict_ledger())
    d = Demand(key="jhub/p", per_card=7, count=1, cpu_milli=3500)
    r = placer.decide(d, ["gpu-1", "gpu-cpu", "gpu-sick", "gpu-9"])
    assert isinstance(r, Refusal) and not r.permanent
    assert {n: v.reason for n, v in r.verdicts.items()} == {
        "gpu-1": Reason.NO_ROOM,
        "gpu-cpu": Reason.CPU,
        "gpu-sick": Reason.UNHEALTHY,
        "gpu-9": Reason.NO_CARDS,
    }
    assert set(r.nodes) == {"gpu-1", "gpu-cpu", "gpu-sick"} and set(r.unresolvable) == {"gpu-9"}
    assert r.nodes == {n: explain(v, d, placer.names) for n, v in r.verdicts.items() if n in r.nodes}
    assert r.reason == (
        "no card has 7 GiB free; the largest free block is 6 GiB (node gpu-1, card 0); "
        "1 more node(s) lack CPU or memory; the pod waits until a slice is released"
    )
    only_host = placer.decide(d, ["gpu-cpu"])
    assert isinstance(only_host, Refusal) and only_host.reason.startswith(
        "pod jhub/p asks 7 GiB on one card, which no node has free now (1 node(s); e.g. node gpu-cpu has"
    )


def test_the_ledger_offers_its_node_states_read_only():
    ledger = verdict_ledger()
    st = ledger.state("gpu-1")
    assert st is not None and st.node.name == "gpu-1" and sum(st.used.values()) == 19
    assert ledger.state("gpu-9") is None and ledger.state("gpu-bad") is None
    states = ledger.states()
    assert set(states) == set(ledger.node_names) and states["gpu-1"] is st
    with pytest.raises(TypeError):
        states["gpu-2"] = st
    ledger.remove_node("gpu-one")
    assert "gpu-one" not in states  # a live view
