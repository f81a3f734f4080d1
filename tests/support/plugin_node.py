"""The kubelet tier's device-plugin node ``NODE``: pods sent to it through our scheduler
(``SCHED``, ``SELECTOR``), the node's annotations, a pod once bound with the extender's record and
the card it names (``bound_pod``, ``placed``, ``chosen_card``), and the node emptied of pods."""

from __future__ import annotations

import json
from typing import Any

from gpushare_hub.core.names import ALLOCATION_ANNOTATION
from tests.conftest import wait_for

NODE = "dp-node"
SCHED = "gpushare-scheduler"
SELECTOR = {"test-group": NODE}


def node_annotations(cluster) -> dict:
    return cluster.core_api().read_node(NODE).metadata.annotations


def bound_pod(cluster, namespace, name, timeout=40) -> dict | None:
    def get():
        pod = cluster.get_json(f"/api/v1/namespaces/{namespace}/pods/{name}")
        ok = pod["spec"].get("nodeName") and ALLOCATION_ANNOTATION in (
            pod["metadata"].get("annotations") or {}
        )
        return pod if ok else None

    return wait_for(get, timeout=timeout)


def chosen_card(pod: dict) -> str:
    return json.loads(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])["cards"][0]["uuid"]


def empty_node(cluster, device_manager) -> None:
    """No pod on the node, in the API server and in the device manager (their devices are free)."""
    assert device_manager.call("forget") == {"ok": True}
    api = cluster.core_api()
    for p in api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items:
        api.delete_namespaced_pod(p.metadata.name, p.metadata.namespace, grace_period_seconds=0)
    assert wait_for(lambda: not api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items)


def placed(cluster, namespace: str, name: str) -> dict[str, Any] | None:
    pod = cluster.get_json(f"/api/v1/namespaces/{namespace}/pods/{name}")
    ok = pod["spec"].get("nodeName") and ALLOCATION_ANNOTATION in (pod["metadata"].get("annotations") or {})
    return pod if ok else None
