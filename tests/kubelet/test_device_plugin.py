"""Our device plugin, driven by the kubelet's own device manager over the v1beta1 gRPC API."""

from __future__ import annotations

import json
import time

from gpushare_hub.core.names import ALLOCATION_ANNOTATION
from tests.conftest import gpu_pod, wait_for
from tests.support.plugin_node import SCHED, SELECTOR, bound_pod, chosen_card, node_annotations

from .conftest import NODE


def test_registration_advertises_memory_units_and_publishes_the_inventory(
    local_cluster, device_manager, plugin
):
    assert device_manager.units() == (30, 30)  # 2 x 15 GiB, as the kubelet counts them
    ann = wait_for(lambda: (a := node_annotations(local_cluster)).get("gpushare-hub.io/allocator") and a)
    cards = json.loads(ann["gpushare-hub.io/cards"])
    assert [(c["index"], c["model"], c["mib"], c["units"]) for c in cards] == [
        (0, "Tesla-T4", 15360, 15),
        (1, "Tesla-T4", 15360, 15),
    ]
    assert all(c["uuid"].startswith("GPU-") for c in cards)
    node = local_cluster.core_api().read_node(NODE)
    assert node.status.capacity["aliyun.com/gpu-count"] == "2"


def test_allocate_gives_the_container_the_card_the_extender_chose(
    local_cluster, device_manager, plugin, namespace
):
    api = local_cluster.core_api()
    api.create_namespaced_pod(namespace, gpu_pod("nb", 5, SCHED, SELECTOR))
    pod = bound_pod(local_cluster, namespace, "nb")
    assert pod, "the pod was not placed"
    out = device_manager.call("allocate", pod=pod, container="notebook")
    assert "error" not in out, out
    env = out["envs"]
    uuid = chosen_card(pod)
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "5" and env["ALIYUN_COM_GPU_MEM_POD"] == "5"
    assert env["ALIYUN_COM_GPU_MEM_DEV"] == "15" and env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5120m"
    assert len(out["devices"]) == 5 and all(d.startswith(uuid + "-_-") for d in out["devices"])
    assigned = wait_for(
        lambda: (
            api.read_namespaced_pod("nb", namespace).metadata.annotations.get("ALIYUN_COM_GPU_MEM_ASSIGNED")
            == "true"
        ),
        timeout=60,
    )
    assert assigned


def test_two_same_size_pods_bound_at_once_get_the_cards_the_extender_chose(
    local_cluster, device_manager, plugin, namespace
):
    """8 GiB twice cannot share a card: the second waits for the first's allocation, then takes card 2."""
    api = local_cluster.core_api()
    # start from empty cards: earlier tests' pods on this node are gone
    for p in api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items:
        api.delete_namespaced_pod(p.metadata.name, p.metadata.namespace, grace_period_seconds=0)
    wait_for(lambda: not api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items)
    for name in ("a", "b"):
        api.create_namespaced_pod(namespace, gpu_pod(name, 8, SCHED, SELECTOR))
    first = wait_for(
        lambda: bound_pod(local_cluster, namespace, "a", 1) or bound_pod(local_cluster, namespace, "b", 1)
    )
    assert first
    other = "b" if first["metadata"]["name"] == "a" else "a"
    time.sleep(1.5)
    assert (
        api.read_namespaced_pod(other, namespace).spec.node_name is None
    )  # held back: it would be ambiguous
    out1 = device_manager.call("allocate", pod=first, container="notebook")
    assert "error" not in out1, out1
    # Retried by kube-scheduler's backoff (1-10 s), not parked until its 5-minute flush: 90 s
    # tells the two apart with room for a loaded machine's steps in between.
    second = bound_pod(local_cluster, namespace, other, timeout=90)
    assert second, "the second pod was not placed within 90 s of the first's allocation"
    out2 = device_manager.call("allocate", pod=second, container="notebook")
    assert "error" not in out2, out2
    assert out1["envs"]["NVIDIA_VISIBLE_DEVICES"] == chosen_card(first)
    assert out2["envs"]["NVIDIA_VISIBLE_DEVICES"] == chosen_card(second)
    assert chosen_card(first) != chosen_card(second)


def test_same_size_pods_share_a_card_and_both_get_it(local_cluster, device_manager, plugin, namespace):
    api = local_cluster.core_api()
    for name in ("x", "y"):
        api.create_namespaced_pod(namespace, gpu_pod(name, 1, SCHED, SELECTOR))
    pods = [bound_pod(local_cluster, namespace, n) for n in ("x", "y")]
    assert all(pods)
    assert chosen_card(pods[0]) == chosen_card(pods[1])
    for pod in pods:
        out = device_manager.call("allocate", pod=pod, container="notebook")
        assert "error" not in out, out
        assert out["envs"]["NVIDIA_VISIBLE_DEVICES"] == chosen_card(pod)


def test_an_allocation_that_cannot_be_matched_fails_naming_the_cause(local_cluster, device_manager, plugin):
    stray = gpu_pod("stray", 4)
    stray["metadata"].update({"namespace": "default", "uid": "00000000-0000-0000-0000-00000000dead"})
    out = device_manager.call("allocate", pod=stray, container="notebook")
    assert "error" in out
    assert f"no pod on node {NODE} waits for a 4 GiB slice" in out["error"]
    assert "gpushare-scheduler" in out["error"]


def test_unhealthy_card_is_withdrawn_and_returns(local_cluster, device_manager, plugin):
    uuid = json.loads(node_annotations(local_cluster)["gpushare-hub.io/cards"])[1]["uuid"]
    plugin.health_file.write_text(json.dumps({uuid: False}))
    assert wait_for(lambda: device_manager.units()[1] == 15, timeout=60), device_manager.call("capacity")
    plugin.health_file.write_text("{}")
    assert wait_for(lambda: device_manager.units()[1] == 30, timeout=60), device_manager.call("capacity")


def test_kubelet_restart_makes_the_plugin_register_again_within_seconds(
    local_cluster, device_manager, plugin
):
    assert device_manager.call("restart") == {"ok": True}  # wipes the folder, as a kubelet start does
    started = time.monotonic()
    # The plugin watches its socket and registers again by itself (no plugin restart); a loaded
    # machine may take longer than the usual 1-3 s, so the wait is generous and the figure printed.
    assert wait_for(lambda: device_manager.units() == (30, 30), timeout=60, every=0.1)
    print(f"re-registered {time.monotonic() - started:.1f}s after the kubelet restart")


def test_plugin_restart_keeps_running_pods_cards(local_cluster, device_manager, plugin, namespace):
    api = local_cluster.core_api()
    api.create_namespaced_pod(namespace, gpu_pod("keep", 2, SCHED, SELECTOR))
    pod = bound_pod(local_cluster, namespace, "keep")
    assert pod
    out = device_manager.call("allocate", pod=pod, container="notebook")
    assert "error" not in out, out
    before = api.read_namespaced_pod("keep", namespace).metadata.annotations
    plugin.kill()
    plugin.start()
    assert wait_for(lambda: device_manager.units() == (30, 30), timeout=30)
    after = api.read_namespaced_pod("keep", namespace).metadata.annotations
    assert after[ALLOCATION_ANNOTATION] == before[ALLOCATION_ANNOTATION]
    assert after["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "true"


def test_per_node_config_map_keeps_a_reserve_back(local_cluster, device_manager, plugin):
    api = local_cluster.core_api()
    api.create_namespaced_config_map(
        "default",
        {
            "metadata": {"name": "gpushare-plugin"},
            "data": {"default": '{"reserveFraction": 0.05}', NODE: '{"reserveFraction": 0.2}'},
        },
    )
    plugin.kill()
    plugin.start("--node-config=default/gpushare-plugin")
    try:  # 15360 MiB x 0.8 = 12288 MiB: 12 GiB units per card
        assert wait_for(lambda: device_manager.units() == (24, 24), timeout=30), device_manager.call(
            "capacity"
        )
    finally:
        plugin.kill()
        plugin.start()
        assert wait_for(lambda: device_manager.units() == (30, 30), timeout=30)


def test_refused_node_options_stop_the_plugin_with_a_warning_on_its_node(
    local_cluster, device_manager, plugin
):
    """A bad value in the node-options ConfigMap: the plugin stops (exit 2) naming the ConfigMap, the
    key and the fix, and says the same in a Warning event on its Node, where `kubectl describe node`
    shows it; nothing it served before is lost (the kubelet keeps the devices it had)."""
    api = local_cluster.core_api()
    api.create_namespaced_config_map(
        "default",
        {"metadata": {"name": "gpushare-plugin-bad"}, "data": {NODE: '{"reserveFraction": "lots"}'}},
    )
    plugin.kill()
    plugin.start("--node-config=default/gpushare-plugin-bad")
    try:
        assert plugin.comp is not None
        assert wait_for(lambda: not plugin.comp.alive(), timeout=30), "the plugin ran on with bad options"
        assert plugin.comp.proc.returncode == 2
        message = (
            "ConfigMap default/gpushare-plugin-bad: reserveFraction must be a number from 0 to 0.99, "
            "got 'lots'"
        )
        assert message in plugin.comp.log.read_text()
        events = api.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={NODE},reason=GPUShareNodeConfigInvalid"
        ).items
        assert [e.message for e in events] == [f"device plugin not started: {message}"]
        assert events[0].type == "Warning"
    finally:
        plugin.start()
        assert wait_for(lambda: device_manager.units() == (30, 30), timeout=30)


def test_a_reserve_that_leaves_a_card_no_slice_stops_the_plugin_naming_the_node(
    local_cluster, device_manager, plugin
):
    """reserveFraction 0.95 keeps 768 MiB of a T4 to sell: not one GiB unit. The plugin stops
    (exit 2) naming the node, the card and the most it may keep back, here and on its Node."""
    api = local_cluster.core_api()
    api.create_namespaced_config_map(
        "default",
        {"metadata": {"name": "gpushare-plugin-greedy"}, "data": {NODE: '{"reserveFraction": 0.95}'}},
    )
    plugin.kill()
    plugin.start("--node-config=default/gpushare-plugin-greedy")
    try:
        assert plugin.comp is not None
        assert wait_for(lambda: not plugin.comp.alive(), timeout=30), "the plugin ran on selling nothing"
        assert plugin.comp.proc.returncode == 2
        message = (
            f"node {NODE}: card 0 (Tesla-T4, 15360 MiB) keeps no slice to sell with reserveFraction 0.95 "
            "(not even 1024 MiB is left); lower reserveFraction in the node's options to at most 0.93"
        )
        assert message in plugin.comp.log.read_text()
        events = api.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={NODE},reason=GPUShareNodeConfigInvalid"
        ).items
        assert f"device plugin not started: {message}" in [e.message for e in events]
    finally:
        plugin.start()
        assert wait_for(lambda: device_manager.units() == (30, 30), timeout=30)
