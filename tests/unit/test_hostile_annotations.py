"""Annotations a notebook user can write, at their worst: every reader refuses them with a reason
and goes on with every other object. (Found by a review: ``1e999`` parses to infinity and
``int(inf)`` raised OverflowError, deep nesting RecursionError; neither was caught, so one such
pod stopped the extender's list, the service's ledger and the plugin's Allocate for everyone.)"""

from __future__ import annotations

from typing import Any

import pytest

from gpushare_hub.core import InvalidObject, Ledger, Placement, demand_from_pod, node_from_k8s
from gpushare_hub.core.annotations import AllocationRecord, CardShare, ContainerShare
from gpushare_hub.core.demand import MAX_MODELS
from gpushare_hub.core.jsonfields import MAX_JSON_CHARS
from gpushare_hub.core.names import ALLOCATION_ANNOTATION, CARDS_ANNOTATION
from gpushare_hub.core.records import IgnoredRecord, read_allocation
from gpushare_hub.core.report import build_report
from gpushare_hub.extender.decisions import Decisions
from gpushare_hub.extender.wire import BadRequest
from gpushare_hub.kube import LedgerInformer
from gpushare_hub.plugin.matching import waiting_containers
from tests.objects import read_node, read_nodes, read_pod, read_pods
from tests.support.extender_calls import args

from .helpers import node_obj, pod_obj

UUID = "GPU-sim-gpu-1-0"
POISON = [
    '{"node":"gpu-1","cards":[{"uuid":"' + UUID + '","index":1e999,"units":1}]}',  # infinity
    '{"node":"gpu-1","cards":[{"uuid":"' + UUID + '","index":0,"units":1e999}]}',
    '{"node":"gpu-1","cards":[{"uuid":"' + UUID + '","index":0,"units":1.9}]}',  # not truncated to 1
    '{"node":"gpu-1","cards":[{"uuid":"' + UUID + '","index":0,"units":true}]}',
    '{"node":"gpu-1","cards":[{"uuid":"' + UUID + '","index":0,"units":"3"}]}',
    '{"node":"gpu-1","cards":["' + UUID + '"]}',
    '{"node":"gpu-1","cards":{"uuid":"x"}}',
    "[" * 100_000,  # nested too deeply for Python's JSON reader
    '{"node":"gpu-1","cards":[],"pad":"' + "x" * MAX_JSON_CHARS + '"}',
    "[]",
]


def poisoned(name: str, raw: str) -> dict[str, Any]:
    return pod_obj(name, 1, node="gpu-1", annotations={ALLOCATION_ANNOTATION: raw})


@pytest.mark.parametrize("raw", POISON, ids=range(len(POISON)))
def test_a_poisoned_allocation_record_holds_no_card_and_says_why(raw):
    got = read_allocation(read_pod(poisoned("evil", raw)), None)
    assert isinstance(got, IgnoredRecord), got
    assert "it holds no card" in got.message()


def test_poisoned_pods_stop_no_reader():
    node = node_obj("gpu-1")
    rec = AllocationRecord("gpu-1", (CardShare(UUID, 0, 5),), (ContainerShare("notebook", UUID, 5),))
    good = pod_obj("good", 5, node="gpu-1", uid="u-good", annotations={ALLOCATION_ANNOTATION: rec.to_json()})
    pods = [poisoned(f"evil-{i}", raw) for i, raw in enumerate(POISON)] + [good]

    inf = LedgerInformer(None)  # what the extender, the spawner and the service keep
    inf.apply("nodes", "ADDED", node)
    for pod in pods:
        inf.apply("pods", "ADDED", pod)
    assert inf.ledger.used("gpu-1", UUID) == 5 and inf.ledger.allocation("jhub/good") is not None

    report = build_report(read_nodes([node]), read_pods(pods))  # kubectl inspect gpushare and the hub service
    held = [p.name for n in report.nodes for c in n.cards for p in c.pods]
    assert held == ["good"] and len(report.warnings) == len(POISON)

    ignored: list[IgnoredRecord] = []  # the device plugin's Allocate
    waiting = waiting_containers(read_pods(pods), node_from_k8s(read_node(node)), set(), ignored=ignored)
    assert [w.pod for w in waiting] == ["jhub/good"] and len(ignored) == len(POISON)


@pytest.mark.parametrize(
    "raw",
    [
        '[{"index":1e999,"uuid":"a","units":15}]',
        '[{"index":0,"uuid":"a","units":15,"mib":1e999}]',
        "[" * 100_000,
    ],
)
def test_a_poisoned_card_inventory_is_refused_with_the_reason(raw):
    node = node_obj("gpu-1")
    node["metadata"]["annotations"][CARDS_ANNOTATION] = raw
    with pytest.raises(InvalidObject, match=r"gpushare-hub\.io/cards"):
        node_from_k8s(read_node(node))
    inf = LedgerInformer(None)
    told: list[tuple[str, str]] = []
    inf.on_unreadable(lambda name, why: told.append((name, why)))  # the extender's Warning event
    inf.apply("nodes", "ADDED", node)
    assert inf.ledger.node("gpu-1") is None and inf.ledger.unreadable("gpu-1")
    assert [name for name, _ in told] == ["gpu-1"]
    assert "node gpu-1 annotation gpushare-hub.io/cards" in told[0][1]


def test_a_huge_card_model_list_is_refused_at_once_naming_the_limit():
    models = ",".join(f"m{i}" for i in range(120_000))
    pod = pod_obj("greedy", 1, annotations={"gpushare-hub.io/exclude-card-models": models})
    with pytest.raises(InvalidObject, match=r"Pod.metadata.annotations: \d+ bytes in all, more than 262144"):
        read_pod(pod)  # past what the API server stores: the reader refuses it
    some = ",".join(f"m{i}" for i in range(200))  # stored, but more models than anyone lists
    stored = pod_obj("greedy", 1, annotations={"gpushare-hub.io/exclude-card-models": some})
    with pytest.raises(InvalidObject, match=f"at most {MAX_MODELS} card models"):
        demand_from_pod(read_pod(stored))
    long_name = pod_obj("long", 1, annotations={"gpushare-hub.io/card-models": "T" * 65})
    with pytest.raises(InvalidObject, match="a model of 65 characters"):
        demand_from_pod(read_pod(long_name))
    many = pod_obj("many", 1, annotations={"gpushare-hub.io/card-models": ",".join(["Tesla-T4"] * 40)})
    assert demand_from_pod(read_pod(many)).models == ("Tesla-T4",)  # repeats count once  # type: ignore[union-attr]
    # The extender's door refuses so large an annotation before anything reads it (400) ...
    with pytest.raises(BadRequest, match=r"Pod.metadata.annotations: \d+ bytes in all, more than 262144"):
        args(pod, [f"gpu-{i}" for i in range(10)])
    # ... and a list small enough to pass the door gets the core's reason, not a weighing of every card.
    fewer = pod_obj("greedy", 1, annotations={"gpushare-hub.io/exclude-card-models": models[:20_000]})
    d = Decisions(Ledger.from_objects(read_nodes([node_obj(f"gpu-{i}") for i in range(10)]), read_pods([])))
    out = d.filter(args(fewer, [f"gpu-{i}" for i in range(10)]))
    assert f"at most {MAX_MODELS} card models" in out.error


def test_the_whole_card_wait_names_no_other_users_pod():
    node = node_obj("gpu-1")
    node["metadata"]["annotations"]["gpushare-hub.io/allocator"] = "gpushare-device-plugin"
    d = Decisions(Ledger.from_objects(read_nodes([node]), read_pods([])))
    assert isinstance(d.bind(read_pod(pod_obj("jupyter-bob", count=1)), "gpu-1"), Placement)
    out = d.filter(args(pod_obj("jupyter-alice", count=1), ["gpu-1"]))
    text = out.error + " ".join((out.failed or {}).values())
    assert "still handing whole cards" in text and "another pod" in text, out
    assert "bob" not in text, text


def test_many_distinct_pod_shapes_do_not_grow_the_placers_caches_without_bound():
    from gpushare_hub.core.policy import MAX_SHAPES, Placer

    ledger = Ledger.from_objects(read_nodes([node_obj("gpu-1")]), read_pods([]))
    placer = Placer(ledger)
    for i in range(MAX_SHAPES + 50):
        pod = pod_obj(f"p{i}", 1, annotations={"gpushare-hub.io/exclude-card-models": f"model-{i}"})
        placer.decide(demand_from_pod(read_pod(pod)))  # type: ignore[arg-type]
    assert len(placer._index) <= MAX_SHAPES
    assert all(len(shapes) <= MAX_SHAPES for _, shapes in placer._cache.values())
