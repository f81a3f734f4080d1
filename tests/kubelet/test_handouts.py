"""Every container gets the card(s) the extender wrote for it, whatever the pod's shape and
the order the kubelet admits pods in: several containers, init + main, two cards."""

from __future__ import annotations

import json
from typing import Any

from gpushare_hub.core.names import ALLOCATION_ANNOTATION
from tests.conftest import gpu_pod, wait_for
from tests.support.plugin_node import SCHED, SELECTOR, empty_node, placed


def shaped(name: str, app: list[int], init: list[int] = (), count: int = 0) -> dict[str, Any]:
    pod = gpu_pod(name, 1, SCHED, SELECTOR)
    base = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [
        {**base, "name": f"c{i}", "resources": {"limits": {"aliyun.com/gpu-mem": str(u)}}}
        for i, u in enumerate(app)
    ]
    if count:
        pod["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-count"] = str(count)
    if init:
        pod["spec"]["initContainers"] = [
            {**base, "name": f"i{i}", "resources": {"limits": {"aliyun.com/gpu-mem": str(u)}}}
            for i, u in enumerate(init)
        ]
    return pod


def expected_cards(pod: dict[str, Any], container: str) -> str:
    record = json.loads(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    return ",".join(c["uuid"] for c in record["containers"] if c["name"] == container)


def admit(device_manager, pod: dict[str, Any]) -> list[str]:
    """The kubelet's admission of one pod: Allocate per container, init containers first."""
    problems = []
    for c in (pod["spec"].get("initContainers") or []) + pod["spec"]["containers"]:
        out = device_manager.call("allocate", pod=pod, container=c["name"])
        want = expected_cards(pod, c["name"])
        got = (out.get("envs") or {}).get("NVIDIA_VISIBLE_DEVICES")
        if got != want:
            problems.append(f"{pod['metadata']['name']}/{c['name']}: wanted {want}, got {got} ({out})")
    return problems


def test_pod_shapes_admitted_in_adversarial_orders_get_the_cards_the_extender_wrote(
    local_cluster, device_manager, plugin, namespace
):
    empty_node(local_cluster, device_manager)
    api = local_cluster.core_api()
    shapes = {
        "multi": shaped("multi", [2, 3]),  # 2 + 3 GiB on one card
        "small": shaped("small", [2]),  # the same size as multi's first container
        "init": shaped("init", [1], init=[1]),  # init + main
        "two": shaped("two", [4], count=2),  # 2 GiB on each of two cards
        "three": shaped("three", [3]),  # the same size as multi's second container
    }
    for body in shapes.values():
        api.create_namespaced_pod(namespace, body)
    admitted: list[str] = []
    problems: list[str] = []

    def progress() -> bool:
        ready = [n for n in shapes if n not in admitted and placed(local_cluster, namespace, n)]
        # Adversarial: the last placed first, and the multi-container pod after its look-alikes.
        for name in sorted(ready, key=lambda n: (n == "multi", -list(shapes).index(n))):
            problems.extend(admit(device_manager, placed(local_cluster, namespace, name)))
            admitted.append(name)
        return len(admitted) == len(shapes)

    assert wait_for(progress, timeout=120, every=1.0), f"admitted only {admitted}"
    assert problems == []
    two = placed(local_cluster, namespace, "two")
    assert len(expected_cards(two, "c0").split(",")) == 2  # the 2-card pod got both cards


def whole_cards_pod(name: str, cards: int) -> dict[str, Any]:
    """A pod asking whole cards by aliyun.com/gpu-count alone (no gpu-mem)."""
    pod = gpu_pod(name, 1, SCHED, SELECTOR)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"aliyun.com/gpu-count": str(cards)}}
    return pod


def test_whole_card_pods_asking_gpu_count_alone_get_exactly_their_cards(
    local_cluster, device_manager, plugin, namespace
):
    """The kubelet calls Allocate only for a resource a plugin registered: the plugin serves
    aliyun.com/gpu-count too (one device per card), and answers the cards the extender wrote."""
    empty_node(local_cluster, device_manager)
    api = local_cluster.core_api()
    assert wait_for(lambda: device_manager.units("aliyun.com/gpu-count") == (2, 2), timeout=30)
    for name, n in (("whole1", 1), ("whole2", 2)):
        api.create_namespaced_pod(namespace, whole_cards_pod(name, n))
        pod = wait_for(lambda name=name: placed(local_cluster, namespace, name), timeout=60)
        assert pod, f"{name} was not placed"
        record = json.loads(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])
        want = [c["uuid"] for c in record["cards"]]
        assert len(want) == n
        out = device_manager.call("allocate", pod=pod, container="notebook")
        assert "error" not in out, out
        assert out["envs"].get("NVIDIA_VISIBLE_DEVICES") == ",".join(want), out
        assert sorted(out["devices"]) == sorted(want)  # the kubelet holds the same cards' devices
        # Served: the plugin marks the pod assigned, and a second Allocate finds nothing waiting.
        assert wait_for(
            lambda name=name: (
                local_cluster.get_json(f"/api/v1/namespaces/{namespace}/pods/{name}")["metadata"][
                    "annotations"
                ].get("ALIYUN_COM_GPU_MEM_ASSIGNED")
                == "true"
            ),
            timeout=20,
        )
        empty_node(local_cluster, device_manager)  # both cards free again for the next pod
