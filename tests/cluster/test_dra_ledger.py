"""Cluster tier: the ledger the hub service uses (the real informer, against the real API server)
counts a ResourceClaim of our driver once its status says it is allocated and reserved, as
kube-scheduler writes it, and gives the units back when the claim is deleted.

The claim's status is written here through the status subresource, so that the test says exactly
which results and capacity the ledger reads; test_dra_scheduling.py shows the scheduler writing
such statuses itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare_hub.core.names import DRA_POD_CLAIM, HUB_USER_ANNOTATION
from gpushare_hub.core.resources import DEFAULT_NAMES
from gpushare_hub.kube.api import make_api_client
from gpushare_hub.kube.kubeconfig import read_kubeconfig
from gpushare_hub.kube.rest import ApiStatusError, RestClient
from gpushare_hub.localcluster.cluster import LocalCluster
from gpushare_hub.service.sources import service_informer
from tests.support.dra_objects import API_VERSION, allocated, claim, device_class, result, slice_obj

RESOURCE = f"/apis/{API_VERSION}"


@pytest.fixture
def rest(local_cluster: LocalCluster) -> Iterator[RestClient]:
    with RestClient(read_kubeconfig(str(local_cluster.kubeconfig))) as api:
        yield api


def create(api: RestClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return api.post(path, body)  # type: ignore[no-any-return]
    except ApiStatusError as err:
        assert err.status == 409, err  # the session's DeviceClass: made by an earlier test
        return body


async def until(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "the ledger did not get there"
        await asyncio.sleep(0.1)


async def test_the_service_ledger_counts_a_claim_and_releases_it_when_deleted(
    local_cluster: LocalCluster, rest: RestClient, node_group: Any, namespace: str
) -> None:
    (node,), _ = node_group(1, cards=2)
    create(rest, f"{RESOURCE}/deviceclasses", device_class())
    create(rest, f"{RESOURCE}/resourceslices", slice_obj(node, cards=2, gib=15))
    made = rest.post(f"{RESOURCE}/namespaces/{namespace}/resourceclaims", claim("nb-gpu", ns=namespace))
    pod = rest.post(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {"name": "nb", "annotations": {HUB_USER_ANNOTATION: "alice"}},
            "spec": {
                "nodeName": node,  # bound, as the scheduler would have: the claim is reserved for it
                "tolerations": [{"operator": "Exists"}],
                "resourceClaims": [{"name": DRA_POD_CLAIM, "resourceClaimName": "nb-gpu"}],
                "containers": [
                    {"name": "nb", "image": "notebook", "resources": {"claims": [{"name": DRA_POD_CLAIM}]}}
                ],
            },
        },
    )

    api = await make_api_client(str(local_cluster.kubeconfig), False)
    informer = service_informer(api, DEFAULT_NAMES)
    try:
        await informer.start()
        assert informer.claims_watched
        ledger = informer.ledger
        key = f"{namespace}/nb"
        assert ledger.allocation(key) is None  # not allocated yet: holds nothing

        status = allocated(made, [result(node, 1, "5Gi")], [("nb", pod["metadata"]["uid"])])["status"]
        claim_path = f"{RESOURCE}/namespaces/{namespace}/resourceclaims/nb-gpu"
        stored = rest.patch_merge(f"{claim_path}/status", {"status": status})
        got = stored["status"]["allocation"]["devices"]["results"][0]
        assert got.get("consumedCapacity") == {"memory": "5Gi"}, got  # the API server kept it

        await until(lambda: ledger.allocation(key) is not None)
        alloc = ledger.allocation(key)
        assert alloc is not None and alloc.node == node and alloc.units == 5
        card = next(c for c in ledger.snapshot()["nodes"] if c["name"] == node)["cards"][1]
        assert card["used"] == 5 and card["free"] == card["units"] - 5
        assert [h["pod"] for h in card["pods"]] == [key]  # shown like an annotation's holder

        rest.request("DELETE", claim_path)
        await until(lambda: ledger.allocation(key) is None)
        assert ledger.used(node, card["uuid"]) == 0
    finally:
        await informer.stop()
        await api.close()
        with contextlib.suppress(ApiStatusError):
            rest.request("DELETE", f"{RESOURCE}/resourceslices/gpushare-hub-{node}")
