"""The plugin's API calls (synchronous ``kubernetes`` client; the gRPC server is threaded)."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

from gpushare_hub.core.cards import Card, cards_to_annotation
from gpushare_hub.core.names import (
    ALLOCATOR_ANNOTATION,
    CARDS_ANNOTATION,
    EVENT_CARD_ANNOTATION,
    GPU_MEM_ASSIGNED,
    GPU_MEM_ASSUME_TIME,
    MPS_LABEL,
    MPS_MULTI_USER_LABEL,
)
from gpushare_hub.core.resources import ResourceNames

from .state import PodSource

# Seconds per API call. Allocate makes up to two (list the node's pods, mark one assigned)
# and the kubelet calls it without a deadline: a slow API server must not stall admission.
API_TIMEOUT = 5.0

RBAC_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "list"]},
]


def api_client(kubeconfig: str | None) -> Any:
    from kubernetes import config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    from kubernetes import client

    return client.ApiClient()


class KubePods(PodSource):
    def __init__(self, api: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        resp: Any = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False, _request_timeout=API_TIMEOUT
        )
        items: list[dict[str, Any]] = json.loads(resp.data)["items"]
        return items

    def mark_assigned(self, namespace: str, name: str, uid: str) -> None:
        body = {
            "metadata": {
                "uid": uid,
                "annotations": {GPU_MEM_ASSIGNED: "true", GPU_MEM_ASSUME_TIME: str(time.time_ns())},
            }
        }
        self.core.patch_namespaced_pod(
            name,
            namespace,
            body,
            _content_type="application/merge-patch+json",
            _request_timeout=API_TIMEOUT,
        )


def publish_isolation(api: Any, node: str, mps: bool, multi_user: bool) -> None:
    """Label the node ``gpushare-hub.io/mps=true`` for the MPS control-daemon DaemonSet (and
    ``gpushare-hub.io/mps-multi-user=true`` where its daemons run ``-M``); the labels come off
    when MPS is switched off."""
    from kubernetes import client

    labels = {
        MPS_LABEL: "true" if mps else None,
        MPS_MULTI_USER_LABEL: "true" if mps and multi_user else None,
    }
    client.CoreV1Api(api).patch_node(
        node, {"metadata": {"labels": labels}}, _content_type="application/merge-patch+json"
    )


def publish_node(api: Any, node: str, cards: list[Card], names: ResourceNames) -> None:
    """The node's card inventory and our allocator mark (metadata), and the card count (status).

    The kubelet itself advertises ``aliyun.com/gpu-mem`` from ListAndWatch.
    """
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.patch_node(
        node,
        {
            "metadata": {
                "annotations": {
                    CARDS_ANNOTATION: cards_to_annotation(cards),
                    ALLOCATOR_ANNOTATION: "gpushare-device-plugin",
                }
            }
        },
        _content_type="application/merge-patch+json",
        _request_timeout=API_TIMEOUT,
    )
    count = str(sum(1 for c in cards if c.healthy))
    core.patch_node_status(
        node,
        {"status": {"capacity": {names.count: count}, "allocatable": {names.count: count}}},
        _content_type="application/merge-patch+json",
        _request_timeout=API_TIMEOUT,
    )


class KubeUsageSink:
    """The usage loop's writes: its own Node's annotations, and Warning events on pods."""

    def __init__(self, api: Any, node: str) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.node = node

    def annotate_node(self, node: str, annotations: dict[str, str | None]) -> None:
        self.core.patch_node(
            node, {"metadata": {"annotations": annotations}}, _content_type="application/merge-patch+json"
        )

    def warn_pod(self, namespace: str, name: str, uid: str, card: str, reason: str, message: str) -> None:
        """The card is written on the Event, so that a restarted plugin finds its earlier warning."""
        earlier = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.uid={uid},reason={reason}"
        )
        if any((e.metadata.annotations or {}).get(EVENT_CARD_ANNOTATION) == card for e in earlier.items):
            return
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{name}.",
                "namespace": namespace,
                "annotations": {EVENT_CARD_ANNOTATION: card},
            },
            "involvedObject": {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": name,
                "namespace": namespace,
                "uid": uid,
            },
            "type": "Warning",
            "reason": reason,
            "message": message,
            "source": {"component": "gpushare-device-plugin", "host": self.node},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.core.create_namespaced_event(namespace, event)
