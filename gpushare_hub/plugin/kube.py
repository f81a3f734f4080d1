"""The plugin's API calls, through the project's small synchronous client
(:mod:`gpushare_hub.kube.rest`), which its threaded gRPC server and its usage loop share."""

from __future__ import annotations

import logging
import time
from typing import Any

from gpushare_hub.core.cards import Card, cards_to_annotation
from gpushare_hub.core.isolation import COOPERATIVE
from gpushare_hub.core.names import (
    ALLOCATOR_ANNOTATION,
    CARDS_ANNOTATION,
    CHECKPOINT_ANNOTATION,
    DEVICE_MODE_ANNOTATION,
    EVENT_CARD_ANNOTATION,
    GPU_MEM_ASSIGNED,
    GPU_MEM_ASSUME_TIME,
    ISOLATION_ANNOTATION,
    MPS_LABEL,
    MPS_MULTI_USER_LABEL,
)
from gpushare_hub.core.objects import PodObject
from gpushare_hub.core.resources import ResourceNames
from gpushare_hub.kube.events import warning_event
from gpushare_hub.kube.kubeconfig import in_cluster_access, read_kubeconfig
from gpushare_hub.kube.reading import readable_pods
from gpushare_hub.kube.rest import RestClient

from .state import PodSource

log = logging.getLogger("gpushare.plugin")

# Seconds per API call (to connect, and for each wait on the answer). Allocate makes up to two
# (list the node's pods, mark one assigned) and the kubelet calls it without a deadline: a slow
# API server must not stall admission. The usage loop and the inventory calls have it too.
API_TIMEOUT = 5.0

RBAC_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "list"]},
]


def rest_client(kubeconfig: str | None) -> RestClient:
    """The client of the API server: the kubeconfig's current context, or the pod's service
    account without one. Every call on it times out after :data:`API_TIMEOUT` (to connect, and
    for each wait on the answer). Raises KubeconfigError when the credentials cannot be used."""
    access = read_kubeconfig(kubeconfig) if kubeconfig else in_cluster_access()
    return RestClient(access, connect_timeout=API_TIMEOUT, read_timeout=API_TIMEOUT)


def node_path(node: str) -> str:
    return f"/api/v1/nodes/{node}"


class KubePods(PodSource):
    def __init__(self, api: RestClient) -> None:
        self.api = api

    def pods_on_node(self, node: str) -> list[PodObject]:
        """The node's pods, read (:func:`~gpushare_hub.core.shapes.read_pod`); one that cannot be
        read is left out with the field named in the log (it gets no card)."""
        return readable_pods(self.api.list("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"}), log)

    def mark_assigned(self, namespace: str, name: str, uid: str) -> None:
        """The uid is a precondition: a pod recreated under the same name is not marked."""
        body = {
            "metadata": {
                "uid": uid,
                "annotations": {GPU_MEM_ASSIGNED: "true", GPU_MEM_ASSUME_TIME: str(time.time_ns())},
            }
        }
        self.api.patch_merge(f"/api/v1/namespaces/{namespace}/pods/{name}", body)


def publish_isolation(
    api: RestClient,
    node: str,
    mps: bool,
    multi_user: bool,
    tier: str = COOPERATIVE,
    mode: str = "",
    checkpoint: str = "",
) -> None:
    """Label the node ``gpushare-hub.io/mps=true`` for the MPS control-daemon DaemonSet (and
    ``gpushare-hub.io/mps-multi-user=true`` where its daemons run ``-M``); the labels come off
    when MPS is switched off. Annotate the tier of isolation the node claims
    (``gpushare-hub.io/isolation``); a self-test of another claim no longer counts (it names
    the tier it checked). Annotate the device mode (``gpushare-hub.io/device-mode``: cdi or legacy)
    and whether the driver can hibernate kernels (``gpushare-hub.io/checkpoint``: yes or no: why)."""
    labels = {
        MPS_LABEL: "true" if mps else None,
        MPS_MULTI_USER_LABEL: "true" if mps and multi_user else None,
    }
    annotations = {
        ISOLATION_ANNOTATION: tier,
        DEVICE_MODE_ANNOTATION: mode or None,
        CHECKPOINT_ANNOTATION: checkpoint or None,
    }
    api.patch_merge(node_path(node), {"metadata": {"labels": labels, "annotations": annotations}})


def publish_node(api: RestClient, node: str, cards: list[Card], names: ResourceNames) -> None:
    """The node's card inventory and our allocator mark (metadata), and the card count (status).

    The kubelet itself advertises ``aliyun.com/gpu-mem`` from ListAndWatch.
    """
    mine = {CARDS_ANNOTATION: cards_to_annotation(cards), ALLOCATOR_ANNOTATION: "gpushare-device-plugin"}
    api.patch_merge(node_path(node), {"metadata": {"annotations": mine}})
    count = str(sum(1 for c in cards if c.healthy))
    api.patch_merge(
        f"{node_path(node)}/status",
        {"status": {"capacity": {names.count: count}, "allocatable": {names.count: count}}},
    )


class KubeUsageSink:
    """The usage loop's writes: its own Node's annotations, and Warning events on pods."""

    def __init__(self, api: RestClient, node: str) -> None:
        self.api = api
        self.node = node

    def annotate_node(self, node: str, annotations: dict[str, str | None]) -> None:
        self.api.patch_merge(node_path(node), {"metadata": {"annotations": annotations}})

    def node_annotation(self, node: str, key: str) -> str | None:
        annotations = (self.api.get(node_path(node)).get("metadata") or {}).get("annotations") or {}
        value = annotations.get(key)
        return value if isinstance(value, str) else None

    def _warning(self, involved: dict[str, str], namespace: str, reason: str, message: str) -> dict[str, Any]:
        return warning_event(involved, namespace, reason, message, "gpushare-device-plugin", self.node)

    def warn_node(self, reason: str, message: str) -> None:
        """A Warning event on this plugin's Node (``kubectl describe node`` shows it)."""
        involved = {"kind": "Node", "name": self.node, "uid": self.node}
        self.api.post(
            "/api/v1/namespaces/default/events", self._warning(involved, "default", reason, message)
        )

    def warn_pod(self, namespace: str, name: str, uid: str, card: str, reason: str, message: str) -> None:
        """The card is written on the Event, so that a restarted plugin finds its earlier warning."""
        events = f"/api/v1/namespaces/{namespace}/events"
        earlier = self.api.list(events, {"fieldSelector": f"involvedObject.uid={uid},reason={reason}"})
        for e in earlier:
            if ((e.get("metadata") or {}).get("annotations") or {}).get(EVENT_CARD_ANNOTATION) == card:
                return
        involved = {"kind": "Pod", "name": name, "namespace": namespace, "uid": uid}
        event = self._warning(involved, namespace, reason, message)
        event["metadata"]["annotations"] = {EVENT_CARD_ANNOTATION: card}
        self.api.post(events, event)
