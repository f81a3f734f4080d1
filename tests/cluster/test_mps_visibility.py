"""A pod placed on a card whose MPS server runs for another UID gets a Warning instead of a silent hang."""

from __future__ import annotations

import json
import uuid

from gpushare_hub.core.cards import declared_cards
from gpushare_hub.core.names import MPS_LABEL, MPS_SERVERS_ANNOTATION
from tests.conftest import gpu_pod, wait_for
from tests.support.extender import SCHED, events_for


def mps_node(local_cluster, server_uid: int, multi_user: bool = False) -> tuple[str, dict[str, str]]:
    """A one-card node whose plugin reports an MPS server for ``server_uid`` on that card."""
    group = f"m{uuid.uuid4().hex[:6]}"
    name = f"{group}-1"
    cards = declared_cards(name, 1, "Tesla T4", 15360)
    labels = {"test-group": group, MPS_LABEL: "true"}
    if multi_user:
        labels["gpushare-hub.io/mps-multi-user"] = "true"
    body = local_cluster.node_object(name, cards, labels=labels)
    body["metadata"]["annotations"][MPS_SERVERS_ANNOTATION] = json.dumps({cards[0].uuid: server_uid})
    local_cluster.core_api().create_node(body)
    local_cluster.wait_nodes_ready([name])
    return name, {"test-group": group}


def mismatch_within(local_cluster, namespace: str, pod: str, seconds: float) -> list[str]:
    """The pod's MPS warnings, waiting up to ``seconds`` for one (the event is written after the bind)."""
    found = wait_for(
        lambda: [m for m in events_for(local_cluster, namespace, pod) if "GPUShareMPSUserMismatch" in m],
        timeout=seconds,
    )
    return found or []


def as_user(pod: dict, uid: int) -> dict:
    pod["spec"]["securityContext"] = {"runAsUser": uid}
    return pod


def test_a_pod_of_another_uid_than_the_cards_mps_server_is_told_why_it_would_wait(
    local_cluster, gpushare, namespace
):
    node, sel = mps_node(local_cluster, server_uid=1000)
    api = local_cluster.core_api()
    api.create_namespaced_pod(namespace, as_user(gpu_pod("bo", 5, SCHED, sel), 1001))
    api.create_namespaced_pod(namespace, as_user(gpu_pod("ana", 5, SCHED, sel), 1000))
    msgs = wait_for(
        lambda: [m for m in events_for(local_cluster, namespace, "bo") if "GPUShareMPSUserMismatch" in m]
    )
    assert msgs, events_for(local_cluster, namespace, "bo")
    assert f"on node {node} runs MPS for UID 1000; pod {namespace}/bo runs as UID 1001" in msgs[0]
    assert "multi-user" in msgs[0]
    assert wait_for(lambda: api.read_namespaced_pod("ana", namespace).spec.node_name == node)
    assert not mismatch_within(local_cluster, namespace, "ana", 3)


def test_multi_user_mps_daemons_raise_no_warning(local_cluster, gpushare, namespace):
    node, sel = mps_node(local_cluster, server_uid=0, multi_user=True)
    api = local_cluster.core_api()
    api.create_namespaced_pod(namespace, as_user(gpu_pod("cy", 5, SCHED, sel), 1001))
    assert wait_for(lambda: api.read_namespaced_pod("cy", namespace).spec.node_name == node)
    assert not mismatch_within(local_cluster, namespace, "cy", 3)
