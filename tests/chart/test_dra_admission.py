"""The chart's DRA admission policies on a real API server: a claim of our class asks one of the
catalogue's sizes (as a quantity), and only the DRA plugin writes our driver's ResourceSlices.

Consumable capacity is on by default from Kubernetes 1.36; the local cluster switches it on at
the older pinned version too (localcluster/controlplane.py's DRA_GATES), so these run at every version,
the chart rendered as for 1.36 there (it refuses older clusters, whose admins would have to switch
the gate on themselves).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare_hub.core.names import DRA_CAPACITY, DRA_DEVICE_CLASS, DRA_DRIVER, DRA_REQUEST
from gpushare_hub.localcluster import build
from gpushare_hub.localcluster.cluster import LocalCluster
from tests.conftest import running_cluster

from .conftest import CHART, Helm

NS = "jupyterhub"


@pytest.fixture(scope="module")
def cluster(helm: Helm) -> Iterator[tuple[LocalCluster, Path]]:
    with running_cluster(scheduler=False) as c:
        version = c.version()
        older = (int(version["major"]), int(version["minor"].rstrip("+"))) < (1, 36)
        render_as = "v1.36.0" if older else version["gitVersion"]
        c.create_namespace(NS)
        out = helm.run(
            "template",
            "gpushare-hub",
            str(CHART),
            "--namespace=gpushare-hub",
            f"--kube-version={render_as}",
            "--set",
            "dra.enabled=true",
            "--show-only=templates/dra-admission.yaml",
        ).stdout
        path = Path(c.kubeconfig).parent / "dra-admission.yaml"
        path.write_text(out)
        kubectl(c, "apply", "-f", str(path))
        yield c, path


def kubectl(
    c: LocalCluster, *args: str, kubeconfig: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [str(build.bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig or c.kubeconfig}", *args]
    return subprocess.run(argv, capture_output=True, text=True, input=stdin, timeout=60)


def claim(name: str, memory: str | None, count: int = 1) -> dict[str, Any]:
    exactly: dict[str, Any] = {
        "deviceClassName": DRA_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": count,
    }
    if memory is not None:
        exactly["capacity"] = {"requests": {DRA_CAPACITY: memory}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": DRA_REQUEST, "exactly": exactly}]}},
    }


def create(
    c: LocalCluster, obj: dict[str, Any], kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return kubectl(c, "create", "-f", "-", kubeconfig=kubeconfig, stdin=yaml.safe_dump(obj))


def refused_eventually(c: LocalCluster, obj: dict[str, Any]) -> str:
    """The policies take effect a moment after they are created: try until refused (30 s)."""
    deadline = time.monotonic() + 30
    while True:
        proc = create(c, obj)
        if proc.returncode != 0:
            return proc.stderr
        kubectl(c, "delete", "-f", "-", stdin=yaml.safe_dump(obj))
        if time.monotonic() > deadline:
            raise AssertionError(f"{obj['metadata']['name']} was accepted for 30 s")
        time.sleep(0.5)


def test_a_size_the_catalogue_does_not_offer_is_refused_naming_claim_size_and_sizes(cluster):
    c, _ = cluster
    err = refused_eventually(c, claim("asks-4g", "4Gi"))
    assert f"ResourceClaim {NS}/asks-4g" in err and "request gpu asks 4Gi" in err, err
    assert "3Gi, 5Gi, 7Gi" in err, err


@pytest.mark.parametrize("memory", ["5Gi", "5368709120"])
def test_a_catalogue_size_is_accepted_in_any_spelling(cluster, memory):
    c, _ = cluster
    refused_eventually(c, claim("warm-up", "4Gi"))
    name = f"asks-{memory.lower()}"
    proc = create(c, claim(name, memory))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("memory", "count", "words"), [(None, 1, "asks no memory"), ("5Gi", 2, "asks count 2")]
)
def test_no_size_or_more_than_one_device_is_refused(cluster, memory, count, words):
    c, _ = cluster
    err = refused_eventually(c, claim(f"bad-{count}-{memory}".lower(), memory, count))
    assert words in err, err


def test_a_template_asking_a_wrong_size_is_refused_too(cluster):
    c, _ = cluster
    body = claim("t-4g", "4Gi")
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": body["metadata"],
        "spec": {"spec": body["spec"]},
    }
    err = refused_eventually(c, template)
    assert f"ResourceClaimTemplate {NS}/t-4g" in err and "4Gi" in err, err


def slice_of(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"gpushare-hub-{node}"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }


def test_only_the_dra_plugin_writes_our_slices(cluster):
    c, _ = cluster
    rules = [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["create", "delete"]}
    ]
    for user in ("alice", "system:serviceaccount:gpushare-hub:gpushare-dra-plugin"):
        c.grant(user, rules)
    alice = c.credential("alice", "alice")
    deadline = time.monotonic() + 30
    while (
        proc := create(c, slice_of("gpu-1"), kubeconfig=alice)
    ).returncode == 0 and time.monotonic() < deadline:
        kubectl(c, "delete", "resourceslice", "gpushare-hub-gpu-1")
        time.sleep(0.5)
    assert "written only by the gpushare DRA plugin of their node" in proc.stderr and "alice" in proc.stderr
    # The plugin's identity without a node-bound token (a client certificate has none) is refused.
    plugin = c.credential("dra", "system:serviceaccount:gpushare-hub:gpushare-dra-plugin")
    proc = create(c, slice_of("gpu-1"), kubeconfig=plugin)
    assert proc.returncode != 0 and "has no node name in its token" in proc.stderr, proc.stderr
    # An admin may repair it.
    assert create(c, slice_of("gpu-1")).returncode == 0
