"""Reading quantities, Node objects and Pod objects."""

from __future__ import annotations

import pytest

from gpushare_hub.core import (
    InvalidObject,
    InvalidQuantity,
    demand_from_pod,
    model_matches,
    node_from_k8s,
    parse_units,
)
from gpushare_hub.core.names import CARDS_ANNOTATION
from tests.objects import read_node, read_pod

from .helpers import node_obj, pod_obj


@pytest.mark.parametrize("value,units", [("5", 5), (5, 5), ("5000m", 5), ("0", 0), ("1k", 1000)])
def test_quantities_are_parsed_by_the_kubernetes_parser(value, units):
    assert parse_units(value, what="x") == units


@pytest.mark.parametrize(
    "value,phrase",
    [
        ("-1", "negative"),
        ("1500m", "whole number"),
        ("lots", "quantity"),
        (float("inf"), "not a finite number"),
        (float("nan"), "not a finite number"),
    ],
)
def test_bad_quantities_are_refused_with_the_reason(value, phrase):
    with pytest.raises(InvalidQuantity, match=phrase):
        parse_units(value, what="pod jhub/a container nb aliyun.com/gpu-mem")


def test_t4_reporting_15360_mib_offers_15_gib_units():
    node = node_from_k8s(read_node(node_obj("gpu-1", cards=2)))
    assert node is not None
    assert [c.units for c in node.cards] == [15, 15]
    assert [c.model for c in node.cards] == ["Tesla-T4", "Tesla-T4"]


def test_node_without_inventory_is_read_from_gpushare_capacity():
    obj = {
        "metadata": {"name": "old-1"},
        "status": {"capacity": {"aliyun.com/gpu-mem": "30", "aliyun.com/gpu-count": "2"}},
    }
    node = node_from_k8s(read_node(obj))
    assert node is not None
    assert [(c.index, c.units, c.uuid) for c in node.cards] == [(0, 15, "old-1/gpu0"), (1, 15, "old-1/gpu1")]


def test_node_without_gpu_memory_is_not_a_gpu_node():
    assert (
        node_from_k8s(read_node({"metadata": {"name": "cpu-1"}, "status": {"capacity": {"cpu": "8"}}}))
        is None
    )


def test_mangled_inventory_names_node_and_annotation():
    obj = node_obj("gpu-1")
    obj["metadata"]["annotations"][CARDS_ANNOTATION] = "{not json"
    with pytest.raises(InvalidObject, match=f"node gpu-1 annotation {CARDS_ANNOTATION}"):
        node_from_k8s(read_node(obj))


def test_model_names_match_across_spellings():
    assert model_matches("Tesla-T4", "T4")
    assert model_matches("Tesla-T4", "tesla t4")
    assert not model_matches("Tesla-T4", "A10")
    assert not model_matches("NVIDIA-A100-80GB", "A100-40GB")
    assert model_matches("A10", "NVIDIA A10") and model_matches("NVIDIA-A10", "A10")
    assert not model_matches("NVIDIA-A100-80GB", "A10") and model_matches("NVIDIA-A100-80GB", "a100")


def test_demand_is_the_sum_of_container_limits():
    pod = pod_obj(
        "a",
        containers=[
            {"name": "nb", "resources": {"limits": {"aliyun.com/gpu-mem": "3"}}},
            {"name": "side", "resources": {"limits": {"aliyun.com/gpu-mem": 2}}},
        ],
    )
    d = demand_from_pod(read_pod(pod))
    assert d is not None
    assert (d.per_card, d.count, d.containers) == (5, 1, (("nb", 3), ("side", 2)))


def test_init_container_rule_takes_the_larger_of_init_and_app_sums():
    init = [{"name": "warm", "resources": {"limits": {"aliyun.com/gpu-mem": "7"}}}]
    d = demand_from_pod(read_pod(pod_obj("a", 5, init=init)))
    assert d is not None and d.per_card == 7
    sidecar = [
        {"name": "sc", "restartPolicy": "Always", "resources": {"limits": {"aliyun.com/gpu-mem": "2"}}}
    ]
    d = demand_from_pod(read_pod(pod_obj("b", 5, init=sidecar)))
    assert d is not None and d.per_card == 7  # a sidecar runs beside the app containers


def test_count_alone_means_whole_cards_and_both_mean_equal_shares():
    whole = demand_from_pod(read_pod(pod_obj("w", count=2)))
    assert whole is not None and (whole.per_card, whole.count, whole.whole) == (None, 2, True)
    split = demand_from_pod(read_pod(pod_obj("s", 8, count=2)))
    assert split is not None and (split.per_card, split.count) == (4, 2)
    with pytest.raises(InvalidObject, match="does not divide evenly"):
        demand_from_pod(read_pod(pod_obj("bad", 5, count=2)))


def test_pod_without_gpu_resources_has_no_demand():
    assert demand_from_pod(read_pod(pod_obj("cpu-only"))) is None


def test_negative_request_is_refused_naming_pod_and_container():
    with pytest.raises(InvalidQuantity, match="pod jhub/neg container notebook"):
        demand_from_pod(read_pod(pod_obj("neg", "-3")))


def test_model_annotations_restrict_and_exclude():
    d = demand_from_pod(
        read_pod(
            pod_obj(
                "m",
                3,
                annotations={
                    "gpushare-hub.io/card-models": "T4, A10",
                    "gpushare-hub.io/exclude-card-models": "A10",
                },
            )
        )
    )
    assert d is not None
    assert d.model_allowed("Tesla-T4") and not d.model_allowed("A10") and not d.model_allowed("V100")
    tke = demand_from_pod(read_pod(pod_obj("t", 3, annotations={"nvidia.com/use-gputype": "A10"})))
    assert tke is not None and tke.models == ("A10",)
