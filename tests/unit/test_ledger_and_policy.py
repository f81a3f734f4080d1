"""The ledger (rebuild, watch events, over-commit guard) and the placement policies."""

from __future__ import annotations

import pytest

from gpushare_hub.core import (
    ALLOCATION_ANNOTATION,
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
from gpushare_hub.core.annotations import GPU_MEM_ASSIGNED, GPU_MEM_IDX, GPU_MEM_POD

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


def annotated(p: Placement, units: dict[str, int] | None = None) -> dict:
    """The pod object as the API server holds it after our bind."""
    ns, name = p.key.split("/")
    ann = p.record().pod_annotations(units or {c.uuid: 15 for c in p.cards}, assume_time_ns=1)
    sizes = {c.units for c in p.cards}
    asks: dict = {"count": len(p.cards)} if len(p.cards) > 1 else {}
    if len(sizes) == 1:
        asks["mem"] = sum(c.units for c in p.cards)
    return pod_obj(
        name, ns=ns, annotations=ann, node=p.node, uid=p.uid or f"uid-{name}", phase="Running", **asks
    )


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
    ledger = Ledger.from_objects([node_obj("gpu-1"), node_obj("gpu-2")], [])
    placer = Placer(ledger)
    placed = [place(placer, f"jhub/p{i}", u) for i, u in enumerate([5, 3, 7, 15, 2])]
    rebuilt = Ledger.from_objects([node_obj("gpu-1"), node_obj("gpu-2")], [annotated(p) for p in placed])
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
    ledger = Ledger.from_objects([node], [pod])
    alloc = ledger.allocation("jhub/legacy")
    assert alloc is not None and alloc.cards[0].uuid == "GPU-sim-gpu-1-1" and alloc.assigned


def test_a_stale_watch_event_does_not_drop_what_we_just_placed():
    ledger = Ledger.from_objects([node_obj("gpu-1")], [])
    placer = Placer(ledger)
    demand = demand_from_pod(pod_obj("nb", 5))
    p = placer.place_and_commit(demand)
    assert isinstance(p, Placement)
    ledger.observe_pod(pod_obj("nb", 5))  # the event from before our annotations
    assert ledger.allocation("jhub/nb") is not None
    ledger.observe_pod(annotated(p))  # now seen with annotations: confirmed
    assert not ledger.allocation("jhub/nb").assumed
    ledger.observe_pod(pod_obj("nb", 5, uid="another-uid"), deleted=True)  # a different pod of that name
    assert ledger.allocation("jhub/nb") is not None
    finished = annotated(p)
    finished["status"]["phase"] = "Succeeded"
    ledger.observe_pod(finished)
    assert ledger.allocation("jhub/nb") is None
    assert ledger.totals() == (0, 30)


def test_unreadable_allocation_annotation_is_ignored_with_the_way_out():
    pod = pod_obj("t", 5, node="gpu-1", annotations={ALLOCATION_ANNOTATION: '{"node": 1}'})
    ledger = Ledger.from_objects([node_obj("gpu-1")], [])
    got = ledger.observe_pod(pod)
    assert isinstance(got, IgnoredRecord) and got.reason is Ignored.UNREADABLE
    assert "not a valid allocation record" in got.message() and "Remove the annotation" in got.message()
    assert ledger.allocations() == [] and ledger.ignored() == [got]


def test_two_legacy_records_on_one_card_count_the_first_and_ignore_the_second():
    node = node_obj("gpu-1", cards=1)
    pods = [
        pod_obj(f"p{i}", 10, node="gpu-1", phase="Running", annotations={GPU_MEM_IDX: "0", GPU_MEM_POD: "10"})
        for i in range(2)
    ]
    ledger = Ledger.from_objects([node], pods)
    assert ledger.overcommitted() == []
    assert ledger.used("gpu-1", "GPU-sim-gpu-1-0") == 10
    (ignored,) = ledger.ignored()
    assert (ignored.key, ignored.reason) == ("jhub/p1", Ignored.CARD_FULL)
    assert "has 5 of 15 units not held by other pods, the record claims 10" in ignored.message()
    ledger.observe_pod(pods[0], deleted=True)  # the card frees up: the second record counts now
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
    ledger = Ledger.from_objects([node_obj("gpu-1"), node_obj("gpu-2")], [])
    got = ledger.observe_pod(pod)
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
    assert ledger.observe_pod(forged("early", 5, node="gpu-1", units=5, uuid="GPU-x")) is None
    (ignored,) = ledger.observe_node(node_obj("gpu-1"))
    assert ignored.reason is Ignored.UNKNOWN_CARD and ledger.allocations() == []


def test_snapshot_lists_every_card_with_its_pods():
    ledger = Ledger.from_objects([node_obj("gpu-1")], [])
    place(Placer(ledger), "jhub/alice", 5)
    snap = ledger.snapshot()
    card = snap["nodes"][0]["cards"][0]
    assert (card["used"], card["free"], card["pods"][0]["pod"]) == (5, 10, "jhub/alice")
    assert (snap["used"], snap["total"], snap["unit"]) == (5, 30, "GiB")


def test_a_pod_with_an_init_container_asking_too_is_read_back_as_placed():
    init = [{"name": "warmup", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]
    pod = pod_obj("nb", 4, init=init)
    ledger = Ledger.from_objects([node_obj("gpu-1")], [])
    placed = Placer(ledger).place_and_commit(demand_from_pod(pod))
    assert isinstance(placed, Placement) and len(placed.containers) == 2
    ann = placed.record().pod_annotations({c.uuid: 15 for c in placed.cards}, assume_time_ns=1)
    seen = pod_obj("nb", 4, init=init, node="gpu-1", annotations=ann, phase="Running")
    assert Ledger.from_objects([node_obj("gpu-1")], [seen]).allocation("jhub/nb") is not None
