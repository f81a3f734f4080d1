"""Card health reaches the scheduler: an unhealthy card is skipped at once, never handed out,
and used again once it recovers (plugin -> Node inventory -> extender -> kube-scheduler)."""

from __future__ import annotations

import json

from tests.conftest import gpu_pod, wait_for
from tests.support.extender import inspect
from tests.support.plugin_node import NODE, SCHED, SELECTOR, chosen_card, empty_node, node_annotations, placed


def inventory_health(cluster) -> dict[str, bool]:
    cards = json.loads(node_annotations(cluster)["gpushare-hub.io/cards"])
    return {c["uuid"]: c["healthy"] for c in cards}


def extender_health(url: str) -> dict[str, bool]:
    """The cards' health as the extender holds it (its watch of the Node, a moment after)."""
    return {c["uuid"]: c["healthy"] for c in inspect(url, NODE)["nodes"][0]["cards"]}


def events_for(cluster, namespace, pod) -> list[str]:
    evs = cluster.core_api().list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return [f"{e.reason}: {e.message}" for e in evs.items]


def test_an_unhealthy_card_is_skipped_at_once_and_used_again_once_it_recovers(
    local_cluster, gpushare, device_manager, plugin, namespace
):
    empty_node(local_cluster, device_manager)
    api = local_cluster.core_api()
    inventory = wait_for(lambda: node_annotations(local_cluster).get("gpushare-hub.io/cards"))
    first, second = json.loads(inventory)
    x, y = first["uuid"], second["uuid"]
    api.create_namespaced_pod(namespace, gpu_pod("a", 2, SCHED, SELECTOR))
    a = wait_for(lambda: placed(local_cluster, namespace, "a"), timeout=40)
    assert a and chosen_card(a) == x
    assert "error" not in device_manager.call("allocate", pod=a, container="notebook")
    try:
        plugin.health_file.write_text(json.dumps({x: False}))
        assert wait_for(lambda: inventory_health(local_cluster) == {x: False, y: True}, timeout=20)
        # The extender has it too (else b could be placed before it heard, on a loaded machine).
        assert wait_for(lambda: extender_health(gpushare.url) == {x: False, y: True}, timeout=30)
        # Binpack would pick the fuller card x; it is unhealthy, so b goes to y.
        api.create_namespaced_pod(namespace, gpu_pod("b", 3, SCHED, SELECTOR))
        b = wait_for(lambda: placed(local_cluster, namespace, "b"), timeout=40)
        assert b and chosen_card(b) == y
        # 13 GiB fits only on x: the pod waits, and its events say why.
        api.create_namespaced_pod(namespace, gpu_pod("c", 13, SCHED, SELECTOR))
        msgs = wait_for(lambda: [m for m in events_for(local_cluster, namespace, "c") if "unhealthy" in m])
        assert msgs, events_for(local_cluster, namespace, "c")
    finally:
        plugin.health_file.write_text("{}")
    assert wait_for(lambda: inventory_health(local_cluster) == {x: True, y: True}, timeout=20)
    c = wait_for(lambda: placed(local_cluster, namespace, "c"), timeout=90)
    assert c and chosen_card(c) == x  # back on the recovered card
    # A card that fails between placement and admission is never handed out.
    plugin.health_file.write_text(json.dumps({x: False}))
    try:
        assert wait_for(lambda: inventory_health(local_cluster)[x] is False, timeout=20)
        out = device_manager.call("allocate", pod=c, container="notebook")
        assert "error" in out and "is unhealthy" in out["error"], out
    finally:
        plugin.health_file.write_text("{}")
    assert wait_for(lambda: inventory_health(local_cluster)[x] is True, timeout=20)
