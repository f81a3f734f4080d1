"""Isolation tiers against the real kube-scheduler and API server: a pod that requires MPS lands only
on the node whose device plugin published ``mps``, waits with our reason when that node is full, is
refused for good when no node enforces the tier, and a tier nobody knows is refused by name."""

from __future__ import annotations

from gpushare_hub.core.names import ISOLATION_ANNOTATION, ISOLATION_CHECK_ANNOTATION
from tests.conftest import gpu_pod, wait_for
from tests.support.extender import SCHED, bound, events_for, inspect


def requiring(name: str, units: int, tier: str, sel: dict[str, str]) -> dict:
    body = gpu_pod(name, units, SCHED, sel)
    body["metadata"]["annotations"] = {ISOLATION_ANNOTATION: tier}
    return body


def failed_scheduling(cluster, namespace: str, pod: str) -> list[str]:
    return [m for m in events_for(cluster, namespace, pod) if m.startswith("FailedScheduling")]


def test_a_slice_requiring_mps_goes_only_to_the_mps_node_and_waits_with_a_reason_when_it_is_full(
    local_cluster, gpushare, node_group, namespace
):
    (coop, mps), sel = node_group(2, cards=1)
    api = local_cluster.core_api()
    api.patch_node(mps, {"metadata": {"annotations": {ISOLATION_ANNOTATION: "mps"}}})
    # The extender hears of the tier through its watch: pods made before it has would be refused.
    assert wait_for(lambda: inspect(gpushare.url, mps)["nodes"][0]["isolation"]["claimed"] == "mps", 30)
    for i in range(3):
        api.create_namespaced_pod(namespace, requiring(f"hard-{i}", 5, "mps", sel))
    pods = wait_for(lambda: bound(local_cluster, namespace, 3))
    assert pods, failed_scheduling(local_cluster, namespace, "hard-0")
    assert {p["spec"]["nodeName"] for p in pods} == {mps}
    # The MPS node is full; the cooperative node has 15 GiB free but may not take it.
    api.create_namespaced_pod(namespace, requiring("hard-late", 5, "mps", sel))
    msgs = wait_for(lambda: failed_scheduling(local_cluster, namespace, "hard-late"))
    # kube-scheduler's own check sees the MPS node full; our extender refuses the other by tier.
    assert msgs and "Insufficient aliyun.com/gpu-mem" in msgs[0], msgs
    refused = (
        f"node {coop} enforces cooperative isolation (cooperative limit for the whole server), "
        "the pod requires mps"
    )
    assert refused in msgs[0], msgs
    assert api.read_namespaced_pod("hard-late", namespace).spec.node_name is None
    # A pod without the requirement still starts, on the cooperative node.
    api.create_namespaced_pod(namespace, gpu_pod("soft", 5, SCHED, sel))
    assert wait_for(lambda: api.read_namespaced_pod("soft", namespace).spec.node_name) == coop


def test_no_node_with_the_tier_or_a_failed_check_refuses_for_good_and_an_unknown_tier_is_named(
    local_cluster, gpushare, node_group, namespace
):
    (claims_mps,), sel = node_group(1, cards=1)
    api = local_cluster.core_api()
    failed = '{"claimed": "mps", "observed": "cooperative", "ok": false, "checked": "2026-11-25T10:00:00Z"}'
    api.patch_node(
        claims_mps,
        {"metadata": {"annotations": {ISOLATION_ANNOTATION: "mps", ISOLATION_CHECK_ANNOTATION: failed}}},
    )
    api.create_namespaced_pod(namespace, requiring("driver-only", 5, "driver", sel))
    api.create_namespaced_pod(namespace, requiring("mps-unchecked", 5, "mps", sel))
    api.create_namespaced_pod(namespace, requiring("steel", 5, "steel", sel))
    msgs = wait_for(lambda: failed_scheduling(local_cluster, namespace, "driver-only"))
    assert msgs and f"node {claims_mps} enforces cooperative isolation" in msgs[0], msgs
    assert "the pod requires driver (hard limit by the driver)" in msgs[0]
    # It claims mps, but its check observed cooperative: it counts as cooperative.
    msgs = wait_for(lambda: failed_scheduling(local_cluster, namespace, "mps-unchecked"))
    assert msgs and f"node {claims_mps} enforces cooperative isolation" in msgs[0], msgs
    msgs = wait_for(lambda: failed_scheduling(local_cluster, namespace, "steel"))
    assert (
        msgs and "annotation gpushare-hub.io/isolation is 'steel', which is not an isolation tier" in msgs[0]
    )
