"""Cluster tier: our ResourceSlices as the real API server stores them and the real default
kube-scheduler allocates them (DRA with consumable capacity), with no extender in the path.

The DRA plugin's publisher writes the slices of kwok nodes (kwok runs pods without a kubelet, so
nothing is prepared here; Prepare is the unit and node tiers'). What this shows: the API server
accepts the slice we build (allowMultipleAllocations, the memory capacity's request policy); the
scheduler shares one card between claims of the catalogue's sizes, takes the first card in our
order that fits, rounds a size between two offered ones up to the next (so the driver's size check
holds), and leaves a claim that fits no card Pending with its words about claims; the publisher
writes the slice again after someone deletes it, with a higher generation.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare_hub.core.draslice import parse_sizes
from gpushare_hub.core.names import DRA_CAPACITY, DRA_DEVICE_CLASS, DRA_POD_CLAIM, DRA_REQUEST
from gpushare_hub.kube.kubeconfig import read_kubeconfig
from gpushare_hub.kube.rest import ApiStatusError, RestClient
from gpushare_hub.localcluster.cluster import LocalCluster
from tests.conftest import wait_for
from tests.support.dra_cluster import ensure_device_class, slice_publisher

RESOURCE = "/apis/resource.k8s.io/v1"
SIZES = parse_sizes("3Gi,5Gi,7Gi")


@pytest.fixture
def rest(local_cluster: LocalCluster) -> Iterator[RestClient]:
    with RestClient(read_kubeconfig(str(local_cluster.kubeconfig))) as api:
        yield api


def claim_pod(api: RestClient, namespace: str, node: str, size: str) -> tuple[str, str]:
    """A ResourceClaim of ``size`` and a pod that uses it, on ``node`` by the default scheduler."""
    name = f"c-{uuid.uuid4().hex[:6]}"
    request = {"name": DRA_REQUEST, "exactly": {
        "deviceClassName": DRA_DEVICE_CLASS, "capacity": {"requests": {DRA_CAPACITY: size}}}}  # fmt: skip
    api.post(
        f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
        {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}},
    )
    pod = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [{"operator": "Exists"}],
            "resourceClaims": [{"name": DRA_POD_CLAIM, "resourceClaimName": name}],
            "containers": [
                {"name": "nb", "image": "notebook", "resources": {"claims": [{"name": DRA_POD_CLAIM}]}}
            ],
        },
    }
    api.post(f"/api/v1/namespaces/{namespace}/pods", pod)
    return name, name


def allocated(api: RestClient, namespace: str, claim: str) -> dict[str, Any] | None:
    status = api.get(f"{RESOURCE}/namespaces/{namespace}/resourceclaims/{claim}").get("status") or {}
    results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
    return results[0] if results else None


def test_the_default_scheduler_shares_our_cards_by_memory_in_our_order(
    local_cluster: LocalCluster, rest: RestClient, node_group: Any, namespace: str
) -> None:
    (node,), _ = node_group(1, cards=2)
    ensure_device_class(rest)
    pub = slice_publisher(rest, node)
    assert pub.publish() and not pub.publish()  # nothing changed: nothing written, no new generation
    stored = rest.get(pub.path)
    assert stored["spec"]["pool"]["generation"] == 1
    memory = stored["spec"]["devices"][0]["capacity"][DRA_CAPACITY]
    assert memory["requestPolicy"]["validValues"] == ["3Gi", "5Gi", "7Gi"], memory  # the API server kept it
    assert not pub.capacity_off

    got: dict[str, dict[str, Any]] = {}
    for size in ("7Gi", "7Gi", "5Gi", "4Gi"):
        claim, _pod = claim_pod(rest, namespace, node, size)
        got[claim] = wait_for(lambda c=claim: allocated(rest, namespace, c), 60)
        assert got[claim], f"claim {claim} of {size} was not allocated"
    placed = [(r["pool"], r["device"], r["consumedCapacity"][DRA_CAPACITY]) for r in got.values()]
    # First fit in the slice's order (gpu-0, gpu-1: nothing is held yet): 7 + 7 on gpu-0, then 5 and
    # the 4 GiB claim, rounded up to the next offered size, on gpu-1.
    assert placed == [(node, "gpu-0", "7Gi"), (node, "gpu-0", "7Gi"), (node, "gpu-1", "5Gi"),
                      (node, "gpu-1", "5Gi")], placed  # fmt: skip

    waiting, _ = claim_pod(rest, namespace, node, "7Gi")  # 1 GiB and 5 GiB left: fits no card

    def refusal() -> str:
        events = rest.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        return " ".join(
            e["message"] for e in events
            if e["involvedObject"]["name"] == waiting and e["reason"] == "FailedScheduling"
        )  # fmt: skip

    words = wait_for(refusal, 60)
    assert "cannot allocate all claims" in words, words
    assert allocated(rest, namespace, waiting) is None


def test_a_deleted_slice_is_written_again_with_a_higher_generation(
    local_cluster: LocalCluster, rest: RestClient, node_group: Any
) -> None:
    (node,), _ = node_group(1, cards=2)
    pub = slice_publisher(rest, node, used={})
    pub.publish()
    first = rest.get(pub.path)
    rest.request("DELETE", pub.path)  # as a kubelet does at its start
    assert pub.publish()
    again = rest.get(pub.path)
    assert again["spec"]["pool"]["generation"] > first["spec"]["pool"]["generation"]
    assert again["metadata"]["ownerReferences"][0]["name"] == node
    pub.delete()
    with pytest.raises(ApiStatusError) as gone:
        rest.get(pub.path)
    assert gone.value.status == 404
