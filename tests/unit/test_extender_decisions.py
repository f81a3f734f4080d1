"""The extender's wire format and decisions, on an in-memory ledger."""

from __future__ import annotations

import json

import pytest

from gpushare_hub.core import Ledger, Placement
from gpushare_hub.core.names import ALLOCATOR_ANNOTATION, GPU_MEM_ASSIGNED
from gpushare_hub.extender.decisions import Decisions
from gpushare_hub.extender.schedconfig import scheduler_config
from gpushare_hub.extender.wire import BadRequest, BindingArgs, ExtenderArgs, filter_result, priority_list
from tests.objects import read_nodes, read_pod, read_pods
from tests.support.extender_calls import args

from .helpers import node_obj, pod_obj


def decisions(*names: str, allocator: bool = False) -> Decisions:
    nodes = [node_obj(n) for n in names]
    if allocator:
        for n in nodes:
            n["metadata"]["annotations"][ALLOCATOR_ANNOTATION] = "gpushare-device-plugin"
    return Decisions(Ledger.from_objects(read_nodes(nodes), read_pods([])))


@pytest.mark.parametrize("capital", [True, False])
def test_both_key_cases_are_read(capital):
    a = args(pod_obj("p", 3), ["gpu-1", "gpu-2"], capital)
    assert a.node_names == ["gpu-1", "gpu-2"] and a.nodes is None


def test_full_node_list_is_read_and_answered_in_kind():
    body = {
        "Pod": pod_obj("p", 3),
        "Nodes": {"items": [node_obj("gpu-1"), node_obj("gpu-2")]},
        "NodeNames": None,
    }
    a = ExtenderArgs.parse(json.dumps(body).encode())
    out = filter_result(a, ["gpu-2"], {"gpu-1": "full"}, {})
    assert out["NodeNames"] is None and [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["gpu-2"]


@pytest.mark.parametrize(
    "raw,message",
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"NodeNames": ["a"]}', "field Pod is missing"),
        (b'{"Pod": {"metadata": {}}}', "neither NodeNames nor Nodes"),
        (b'{"Pod": {"metadata": {}}, "NodeNames": "gpu-1"}', "NodeNames must be a list"),
        (
            b'{"Pod": {"metadata": {}}, "Nodes": {"items": [{}]}}',
            r"Nodes.items\[0\].metadata: expected an object, got null",
        ),
        (
            b'{"Pod": {"metadata": {}}, "Nodes": {"items": [{"metadata": {}}]}}',
            "Nodes.items.0..metadata.name: missing",
        ),
    ],
)
def test_malformed_filter_bodies_name_the_problem(raw, message):
    with pytest.raises(BadRequest, match=message):
        ExtenderArgs.parse(raw)


def test_binding_args_need_names_and_node():
    b = BindingArgs.parse(b'{"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n"}')
    assert (b.pod_name, b.pod_namespace, b.pod_uid, b.node) == ("p", "ns", "u", "n")
    with pytest.raises(BadRequest, match="field Node is missing"):
        BindingArgs.parse(b'{"PodName":"p","PodNamespace":"ns","PodUID":"u"}')


def test_filter_keeps_fitting_nodes_and_explains_the_rest():
    d = decisions("gpu-1", "gpu-2")
    d.bind(read_pod(pod_obj("a", 14)), "gpu-1")
    d.bind(read_pod(pod_obj("b", 14)), "gpu-1")
    out = d.filter(args(pod_obj("c", 3), ["gpu-1", "gpu-2", "cpu-9"]))
    assert out.passed == ["gpu-2"]
    assert "largest free block is 1 GiB" in out.failed["gpu-1"]
    assert "cpu-9" in out.unresolvable


def test_larger_than_any_card_is_unresolvable():
    out = decisions("gpu-1").filter(args(pod_obj("big", 16), ["gpu-1"]))
    assert out.passed == [] and "hold at most 15 GiB" in out.unresolvable["gpu-1"]


def test_bad_requests_in_the_pod_become_filter_errors_not_crashes():
    d = decisions("gpu-1")
    out = d.filter(args(pod_obj("neg", "-2"), ["gpu-1"]))
    assert out.passed == [] and "negative" in out.error
    out = d.filter(args(pod_obj("frac", "1.5"), ["gpu-1"]))
    assert "whole number" in out.error
    out = d.filter(args(pod_obj("pol", 2, annotations={"gpushare-hub.io/policy": "random"}), ["gpu-1"]))
    assert "is not a policy" in out.error


def test_pods_without_our_resource_pass_untouched():
    out = decisions("gpu-1").filter(args(pod_obj("cpu"), ["gpu-1", "other"]))
    assert out.passed == ["gpu-1", "other"] and not out.failed


def test_prioritize_follows_the_pods_policy_annotation():
    d = decisions("gpu-1", "gpu-2")
    d.bind(read_pod(pod_obj("a", 5)), "gpu-1")
    packed = d.prioritize(args(pod_obj("x", 3), ["gpu-1", "gpu-2"]))
    spread = d.prioritize(
        args(pod_obj("y", 3, annotations={"gpushare-hub.io/policy": "spread"}), ["gpu-1", "gpu-2"])
    )
    assert packed == {"gpu-1": 10, "gpu-2": 0} and spread == {"gpu-2": 10, "gpu-1": 0}
    assert priority_list(packed, ["gpu-2", "gpu-1"]) == [
        {"Host": "gpu-2", "Score": 0},
        {"Host": "gpu-1", "Score": 10},
    ]


def test_bind_records_the_card_and_a_stale_pod_copy_never_frees_it():
    d = decisions("gpu-1")
    p = d.bind(read_pod(pod_obj("a", 5)), "gpu-1")
    assert isinstance(p, Placement) and d.ledger.allocation("jhub/a").assumed
    # The pod copy has no nodeName, but the first bind may have gone through: the binder,
    # not a second bind, decides when that reservation goes.
    again = d.bind(read_pod(pod_obj("a", 5)), "gpu-1")
    assert not isinstance(again, Placement) and "already holds cards on node gpu-1" in again.reason
    assert d.ledger.totals()[0] == 5 and d.ledger.allocation("jhub/a").cards == p.cards


def test_same_size_pods_wait_for_allocation_rather_than_spread_over_cards_of_a_plugin_node():
    d = decisions("gpu-1", allocator=True)
    first = d.bind(read_pod(pod_obj("a", 10)), "gpu-1")
    second = d.bind(read_pod(pod_obj("b", 10)), "gpu-1")  # card 0 has 5 left: would need card 1
    assert isinstance(first, Placement)
    assert not isinstance(second, Placement) and "ambiguous for the device plugin" in second.reason
    assert isinstance(d.bind(read_pod(pod_obj("c", 5)), "gpu-1"), Placement)  # another size is fine
    # the plugin marks the first one allocated: now the second may take card 1
    ann = first.record().pod_annotations({u.uuid: 15 for u in first.cards}, 1) | {GPU_MEM_ASSIGNED: "true"}
    d.ledger.observe_pod(read_pod(pod_obj("a", 10, annotations=ann, node="gpu-1", phase="Running")))
    second = d.bind(read_pod(pod_obj("b", 10)), "gpu-1")
    assert isinstance(second, Placement) and second.cards[0].index == 1


def test_same_size_pods_share_a_card_while_unallocated():
    d = decisions("gpu-1", allocator=True)
    a = d.bind(read_pod(pod_obj("a", 3)), "gpu-1")
    b = d.bind(read_pod(pod_obj("b", 3)), "gpu-1")
    assert isinstance(a, Placement) and isinstance(b, Placement) and a.cards == b.cards


def test_generated_scheduler_config_uses_every_verb_on_our_resource():
    cfg = scheduler_config("http://127.0.0.1:32766/gpushare-scheduler")
    ext = cfg["extenders"][0]
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert cfg["profiles"][0]["schedulerName"] == "gpushare-scheduler"
    assert (ext["filterVerb"], ext["bindVerb"]) == ("filter", "bind") and "prioritizeVerb" not in ext
    fgd = scheduler_config("http://x", policy="fgd")["extenders"][0]
    assert fgd["prioritizeVerb"] == "prioritize" and fgd["weight"] == 10
    strand = scheduler_config("http://x", policy="strand")["extenders"][0]
    assert strand["prioritizeVerb"] == "prioritize" and strand["weight"] == 10
    assert ext["nodeCacheCapable"] is True and ext["managedResources"][0]["name"] == "aliyun.com/gpu-mem"


def test_a_pod_held_only_by_the_short_ambiguity_hold_is_retried_not_parked():
    d = decisions("gpu-1", allocator=True)
    assert isinstance(d.bind(read_pod(pod_obj("a", 10)), "gpu-1"), Placement)
    out = d.filter(args(pod_obj("b", 10), ["gpu-1"]))
    assert out.passed == [] and out.error.startswith("retrying shortly: node gpu-1 is still handing")
    d2 = decisions("gpu-1", "gpu-2", allocator=True)
    d2.bind(read_pod(pod_obj("a", 10)), "gpu-1")
    out = d2.filter(args(pod_obj("b", 10), ["gpu-1", "gpu-2"]))
    assert out.passed == ["gpu-2"] and out.error == ""  # another node will do: no error


def test_filter_says_each_nodes_verdict_in_the_documented_words_and_retries_only_for_a_handout():
    d = decisions("gpu-1", "gpu-2", allocator=True)
    for name, units, node in [("a", 14, "gpu-1"), ("b", 13, "gpu-1"), ("c", 10, "gpu-2")]:
        assert isinstance(d.bind(read_pod(pod_obj(name, units)), node), Placement)
    out = d.filter(args(pod_obj("x", 3), ["gpu-1", "cpu-9"]))
    assert out.failed == {
        "gpu-1": "no card on node gpu-1 has 3 GiB free; the largest free block is 2 GiB (card 1)"
    }
    no_cards = "node cpu-9 offers no aliyun.com/gpu-mem (no GPU-sharing cards known)"
    assert out.unresolvable == {"cpu-9": no_cards}
    assert out.error == ""  # no room is no short hold: the pod is parked, not retried
    out = d.filter(args(pod_obj("y", 10), ["gpu-1", "gpu-2"]))  # gpu-2 still hands c's 10 GiB
    assert out.error == (
        "retrying shortly: node gpu-2 is still handing a 10 GiB slice of card 0 to another pod; a second "
        "one on another card now would be ambiguous for the device plugin, so this pod waits until that "
        "allocation is done"
    )
