"""The shape check at the doors: exactly the fields the core reads, with the field named on refusal;
and what passes it never makes the core fail with anything but its own error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare_hub.core import Ledger, Placer, demand_from_pod
from gpushare_hub.core.errors import GPUShareError, InvalidObject
from gpushare_hub.core.objects import Condition, Container, PodObject
from gpushare_hub.core.shapes import check_depth, read_node, read_pod
from gpushare_hub.extender.service import ExtenderService
from gpushare_hub.extender.wire import ExtenderArgs
from tests.mutate import paths, replaced

from .helpers import node_obj, pod_obj


def test_a_valid_pod_and_node_are_read_into_typed_values():
    raw = pod_obj("nb", 5, annotations={"gpushare-hub.io/policy": "spread"}, node="gpu-1")
    raw["spec"]["securityContext"] = {"runAsUser": 1000}
    raw["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "message": "waits"}]
    pod = read_pod(raw)
    assert isinstance(pod, PodObject) and pod.key == "jhub/nb" and pod.node_name == "gpu-1"
    assert pod.annotations["gpushare-hub.io/policy"] == "spread" and pod.run_as_user == 1000
    assert pod.containers == (Container("notebook", limits={"aliyun.com/gpu-mem": 5}),)
    assert pod.conditions == (Condition("PodScheduled", "False", "", "waits"),)
    node = read_node(node_obj("gpu-1"))
    assert node.name == "gpu-1" and node.capacity["aliyun.com/gpu-mem"] == "30"
    assert read_pod({"metadata": {"name": "gone", "namespace": "jhub"}}).key == "jhub/gone"


@pytest.mark.parametrize(
    "obj,message",
    [
        ([], "Pod: expected an object, got a list []"),
        ({"metadata": None}, "Pod.metadata: expected an object, got null None"),  # required
        ({"metadata": {"labels": {"a": 1}}}, "Pod.metadata.labels['a']: expected a string, got a number 1"),
        (
            {"metadata": {}, "spec": {"initContainers": [3]}},
            "Pod.spec.initContainers[0]: expected an object, got a number 3",
        ),
        (
            {"metadata": {}, "status": {"conditions": [{"message": ["x"]}]}},
            "Pod.status.conditions[0].message: expected a string, got a list ['x']",
        ),
        (
            {
                "metadata": {},
                "spec": {"containers": [{"resources": {"limits": {"aliyun.com/gpu-mem": True}}}]},
            },
            "Pod.spec.containers[0].resources.limits['aliyun.com/gpu-mem']: expected a quantity",
        ),
        ({"metadata": {"name": "n" * 5000}}, "Pod.metadata.name: 5000 characters, more than 253"),
        (
            {"metadata": {}, "spec": {"securityContext": {"runAsUser": -1}}},
            "Pod.spec.securityContext.runAsUser: expected a UID, a whole number from 0 to 2147483647",
        ),
        (
            {"metadata": {}, "spec": {"containers": [{"securityContext": {"runAsUser": "root"}}]}},
            "Pod.spec.containers[0].securityContext.runAsUser: expected a UID",
        ),
    ],
)
def test_a_wrong_field_is_named_with_what_was_expected(obj, message):
    with pytest.raises(InvalidObject) as err:
        read_pod(obj)
    assert (
        str(err.value).startswith(message.split(": expected")[0])
        and message.split("Pod")[-1] in str(err.value)
    ) or message in str(err.value), str(err.value)


def test_a_node_needs_its_name_and_quantities():
    with pytest.raises(InvalidObject, match=r"Node.metadata.name: missing"):
        read_node({"metadata": {}})
    bad = node_obj("gpu-1")
    bad["status"]["capacity"]["aliyun.com/gpu-mem"] = {"x": 1}
    with pytest.raises(
        InvalidObject, match=r"Node.status.capacity\['aliyun.com/gpu-mem'\]: expected a quantity"
    ):
        read_node(bad)


def test_an_echoed_value_is_cut_short():
    with pytest.raises(InvalidObject) as err:
        read_pod({"metadata": {"uid": ["y" * 10_000]}})
    assert len(str(err.value)) < 120


def test_depth_is_bounded():
    value: object = 1
    for _ in range(40):
        value = {"a": value}
    with pytest.raises(InvalidObject, match="nests deeper than 32 levels"):
        check_depth(value)
    check_depth(pod_obj("nb", 5))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=8,
)
VALID = pod_obj(
    "nb",
    5,
    annotations={"gpushare-hub.io/policy": "binpack", "gpushare-hub.io/card-models": "T4"},
    init=[{"name": "i", "resources": {"requests": {"aliyun.com/gpu-mem": "1"}}, "restartPolicy": "Always"}],
)
PATHS = list(paths(VALID))


@settings(max_examples=2000, deadline=None, derandomize=True)
@given(path=st.sampled_from(PATHS), new=json_values)
def test_whatever_the_reader_accepts_the_core_reads_without_failing_on_types(path, new):
    raw = replaced(VALID, path, new)
    try:
        pod = read_pod(raw)
    except InvalidObject:
        return
    # The extender's own path: its filter and prioritize answer a refusal in words, never raise.
    service = ExtenderService(kube=None)
    service.ledger.observe_node(read_node(node_obj("gpu-1")))
    args = ExtenderArgs(pod=pod, node_names=["gpu-1"], nodes=None)
    service.decisions.filter(args)
    service.decisions.prioritize(args)
    ledger = Ledger()
    ledger.observe_node(read_node(node_obj("gpu-1")))
    try:
        ledger.observe_pod(read_pod(json.loads(json.dumps(raw))))
        if (demand := demand_from_pod(pod)) is not None and demand.policy is None:
            Placer(ledger, "binpack").decide(demand)
    except GPUShareError:
        pass  # the core's own refusal, with its message: what a door answers
