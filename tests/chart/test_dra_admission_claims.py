"""The chart's DRA admission policies against one claim shared by many pods (issue 48), on a real
API server: a claim of our class is made only in the hub's namespace, there only by Kubernetes'
resource-claim controller (from a pod's template) or an admin; it is one request for one device;
its status (what kube-scheduler writes) holds one device of our driver and one pod at most."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare_hub.core.names import DRA_DEVICE_CLASS, DRA_DRIVER, DRA_REQUEST
from gpushare_hub.localcluster.cluster import LocalCluster
from tests.conftest import wait_for
from tests.support.dra_admission import (
    NS,
    claim,
    create,
    dra_policies_cluster,
    kubectl,
    refused_eventually,
    template_of,
)

from .conftest import CHART, Helm

USER_RULES = [
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims", "resourceclaimtemplates"],
        "verbs": ["create", "get", "list", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "delete"]},
]


@pytest.fixture(scope="module")
def cluster(helm: Helm) -> Iterator[tuple[LocalCluster, Path]]:
    with dra_policies_cluster(helm, CHART) as made:
        made[0].grant("alice", USER_RULES)
        made[0].create_namespace("alice")
        yield made


def test_a_user_may_not_write_a_claim_of_our_class_and_the_claim_controller_still_may(cluster):
    """One claim named by N pods is N slices for the price of one: a user's own claim of our class
    is refused in the hub's namespace (only the resource-claim controller makes them there, one per
    pod) and anywhere else; a pod naming a catalogue template still gets its claim."""
    c, _ = cluster
    alice = c.credential("alice", "alice")
    err = refused_eventually(c, claim("mine", "5Gi"), kubeconfig=alice)
    assert f"ResourceClaim {NS}/mine asks {DRA_DEVICE_CLASS}" in err, err
    assert "created only by Kubernetes' resource-claim controller" in err and "alice may not create" in err
    for body in (
        claim("elsewhere", "5Gi", namespace="alice"),
        template_of(claim("t", "5Gi", namespace="alice")),
    ):
        err = refused_eventually(c, body, kubeconfig=alice)
        assert f"{body['kind']} alice/" in err and f"only in the hub's namespace {NS}" in err, err
    # An admin may not either: outside the hub's namespace no claim of ours would be counted right.
    err = refused_eventually(c, claim("admins", "5Gi", namespace="alice"))
    assert f"only in the hub's namespace {NS}" in err, err
    # The way the hub asks: a template in the hub's namespace, a pod naming it, the claim made by
    # kube-controller-manager's resource-claim controller as its own service account.
    assert create(c, template_of(claim("gpushare-slice-t4-5g", "5Gi")), kubeconfig=alice).returncode == 0
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "notebook", "namespace": NS},
        "spec": {
            "schedulerName": "nobody-schedules-this",
            "containers": [{"name": "c", "image": "quay.io/jupyter/base-notebook"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpushare-slice-t4-5g"}],
        },
    }
    proc = create(c, pod, kubeconfig=alice)
    assert proc.returncode == 0, proc.stderr

    def made() -> str:
        got = json.loads(kubectl(c, "get", "pod", "notebook", f"--namespace={NS}", "-o", "json").stdout)
        statuses = got.get("status", {}).get("resourceClaimStatuses") or [{}]
        return str(statuses[0].get("resourceClaimName") or "")

    name = wait_for(made, timeout=120, every=0.5)
    assert name, "the resource-claim controller made no claim for the pod (was it refused?)"
    owned = json.loads(kubectl(c, "get", "resourceclaim", name, f"--namespace={NS}", "-o", "json").stdout)
    assert owned["metadata"]["ownerReferences"][0]["name"] == "notebook"


def _status(c: LocalCluster, name: str, results: list[dict[str, Any]], pods: list[str]) -> str:
    """Write the claim's status as kube-scheduler does (allocation, reservedFor); '' or the refusal."""
    status: dict[str, Any] = {"allocation": {"devices": {"results": results}}}
    if pods:
        status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in pods]
    proc = kubectl(
        c, "patch", "resourceclaim", name, f"--namespace={NS}", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": status}),
    )  # fmt: skip
    return "" if proc.returncode == 0 else proc.stderr


def _result(device: str, request: str = DRA_REQUEST) -> dict[str, str]:
    return {"request": request, "driver": DRA_DRIVER, "pool": "gpu-1", "device": device}


def test_a_claim_of_ours_is_reserved_for_one_pod_and_holds_one_device_of_our_driver(cluster):
    """kube-scheduler writes status.reservedFor through resourceclaims/status: a second pod naming
    an allocated slice's claim is refused there, so it stays unscheduled; an allocation of two of
    our devices, or of ours for a request of another class, is refused too."""
    c, _ = cluster
    for name in ("shared", "pair"):
        assert create(c, claim(name, "5Gi")).returncode == 0  # as the admin, in the hub's namespace
    other = claim("other", None)
    other["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "any-gpu.example.com"
    assert create(c, other).returncode == 0
    one = [_result("gpu-0")]
    err = wait_for(lambda: _status(c, "shared", one, ["nb-a", "nb-b"]), timeout=60, every=0.5)
    assert f"ResourceClaim {NS}/shared holds a GPU slice of {DRA_DEVICE_CLASS}" in err, err
    assert "reserved for one pod at most; reservedFor would name pods nb-a, pods nb-b" in err, err
    assert _status(c, "shared", one, ["nb-a"]) == ""  # the first pod's reservation
    err = _status(c, "shared", one, ["nb-a", "nb-b"])
    assert "reserved for one pod at most" in err, err
    err = _status(c, "pair", [_result("gpu-0"), _result("gpu-1")], [])
    assert "would be allocated 2 devices of driver" in err and "gpu-1/gpu-0, gpu-1/gpu-1" in err, err
    err = _status(c, "other", one, [])
    assert f"for request gpu, which does not ask {DRA_DEVICE_CLASS}" in err, err


def _asks(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    body = claim(name, "5Gi")
    body["spec"]["devices"]["requests"] = list(requests)
    return body


def _exactly(name: str, memory: str = "5Gi", cls: str = DRA_DEVICE_CLASS, **more: Any) -> dict[str, Any]:
    spec = {"deviceClassName": cls, "capacity": {"requests": {"memory": memory}}, **more}
    return {"name": name, "exactly": spec}


def test_a_claim_of_our_class_is_one_request_for_one_device(cluster):
    c, _ = cluster
    sub = [
        {"name": s, "deviceClassName": DRA_DEVICE_CLASS, "capacity": {"requests": {"memory": m}}}
        for s, m in (("small", "3Gi"), ("large", "5Gi"))
    ]
    cases = [
        (_asks("two", _exactly("gpu"), _exactly("more")), "has 2 requests (gpu, more)"),
        (_asks("nic", _exactly("gpu"), _exactly("nic", cls="nic.example.com")), "has 2 requests (gpu, nic)"),
        (_asks("either", {"name": "gpu", "firstAvailable": sub}), "more than one firstAvailable subrequest"),
        (_asks("all", _exactly("gpu", allocationMode="All")), "asks allocationMode All"),
    ]
    for body, words in cases:
        err = refused_eventually(c, body)
        assert words in err, (yaml.safe_dump(body), err)
