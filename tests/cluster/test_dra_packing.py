"""Cluster tier: the DRA packing (dra.scheduler: gpushare) on the real kube-scheduler (1.36+).

Our slices are published on two kwok nodes of one card each; a 7 GiB claim holds the first
node's card. The default scheduler sends the next claim to the emptier node (its spreading), so
the nodes hold 7 and 3 GiB (each notebook asks 4 of a node's 32 CPUs, so the default scoring
prefers the node with fewer notebooks). A kube-scheduler whose profile calls only the extender's
prioritize-only verb then sends a 5 GiB and a 3 GiB claim, made from templates as the spawner's
pods make them, both to the fuller node (binpack), where the default scoring would have spread
them; kube-scheduler allocates each claim and binds each pod itself.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare_hub.core.names import (
    DRA_CAPACITY,
    DRA_DEVICE_CLASS,
    DRA_POD_CLAIM,
    DRA_REQUEST,
    DRA_TEMPLATE_PREFIX,
)
from gpushare_hub.extender.schedconfig import dra_extender_entry, dra_profile
from gpushare_hub.kube.kubeconfig import read_kubeconfig
from gpushare_hub.kube.rest import RestClient
from gpushare_hub.localcluster.cluster import LocalCluster
from tests.conftest import wait_for
from tests.support.dra_cluster import ensure_device_class, slice_publisher

RESOURCE = "/apis/resource.k8s.io/v1"


@pytest.fixture
def rest(local_cluster: LocalCluster) -> Iterator[RestClient]:
    with RestClient(read_kubeconfig(str(local_cluster.kubeconfig))) as api:
        yield api


def publish(api: RestClient, node: str) -> None:
    assert slice_publisher(api, node).publish()


def request(size: str) -> dict[str, Any]:
    return {"name": DRA_REQUEST, "exactly": {
        "deviceClassName": DRA_DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1,
        "capacity": {"requests": {DRA_CAPACITY: size}}}}  # fmt: skip


def setup_class_and_templates(api: RestClient, namespace: str) -> None:
    ensure_device_class(api)
    for size in ("3Gi", "5Gi", "7Gi"):
        api.post(
            f"{RESOURCE}/namespaces/{namespace}/resourceclaimtemplates",
            {
                "metadata": {"name": f"{DRA_TEMPLATE_PREFIX}{size.lower()}"},
                "spec": {"spec": {"devices": {"requests": [request(size)]}}},
            },
        )


def slice_pod(api: RestClient, namespace: str, size: str, scheduler: str, selector: dict[str, str]) -> str:
    name = f"nb-{uuid.uuid4().hex[:6]}"
    pod = {
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": selector,
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [
                {"name": DRA_POD_CLAIM, "resourceClaimTemplateName": f"{DRA_TEMPLATE_PREFIX}{size.lower()}"}
            ],
            "containers": [
                {
                    "name": "nb",
                    "image": "notebook",
                    "resources": {
                        "claims": [{"name": DRA_POD_CLAIM}],
                        "requests": {"cpu": "4", "memory": "16Gi"},
                    },
                }
            ],
        },
    }
    api.post(f"/api/v1/namespaces/{namespace}/pods", pod)
    return name


def placed(api: RestClient, namespace: str, pod: str) -> tuple[str, str] | None:
    """(node, device) once the pod is bound and its claim allocated."""
    obj = api.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    node = obj["spec"].get("nodeName")
    claims = {
        s["name"]: s.get("resourceClaimName")
        for s in obj.get("status", {}).get("resourceClaimStatuses") or []
    }
    claim = claims.get(DRA_POD_CLAIM)
    if not node or not claim:
        return None
    status = api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}").get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    return (node, results[0]["device"]) if results else None


def ledger_used(url: str, node: str) -> int:
    with urllib.request.urlopen(f"{url}/inspect/{node}", timeout=5) as r:
        return sum(c["used"] for c in json.loads(r.read())["nodes"][0]["cards"])


def test_the_prioritize_only_profile_packs_claims_where_the_default_scheduler_spreads(
    local_cluster: LocalCluster, rest: RestClient, node_group: Any, namespace: str
) -> None:
    (a, b), selector = node_group(2, cards=1)
    for node in (a, b):
        publish(rest, node)
    setup_class_and_templates(rest, namespace)

    first = slice_pod(rest, namespace, "7Gi", "default-scheduler", {"kubernetes.io/hostname": a})
    assert wait_for(lambda: placed(rest, namespace, first), 60) == (a, "gpu-0")
    spread = slice_pod(rest, namespace, "3Gi", "default-scheduler", selector)
    assert wait_for(lambda: placed(rest, namespace, spread), 60) == (b, "gpu-0")  # the emptier node

    name = f"gpushare-dra-{uuid.uuid4().hex[:6]}"
    ext = local_cluster.start_extender("binpack", name=f"gpushare-extender-{name}")
    local_cluster.start_scheduler(
        name, extenders=[dra_extender_entry(f"{ext.url}/gpushare-scheduler")], profile=dra_profile(name)
    )
    # The extender's ledger counts the claims: 7 GiB on a, 3 GiB on b.
    assert wait_for(lambda: (ledger_used(ext.url, a), ledger_used(ext.url, b)) == (7, 3), 60)

    for size in ("5Gi", "3Gi"):
        pod = slice_pod(rest, namespace, size, name, selector)
        got = wait_for(lambda p=pod: placed(rest, namespace, p), 60)
        assert got == (a, "gpu-0"), f"{size} went to {got}, not to the fuller node {a}"
        # The ledger sees the new claim before the next pod is scored.
        assert wait_for(lambda s=int(size[0]): ledger_used(ext.url, a) >= 7 + s, 30)
