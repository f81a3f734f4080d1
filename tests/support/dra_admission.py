"""The chart's DRA admission policies on a control plane of their own, for the chart tier's tests
(tests/chart/test_dra_admission*.py): the chart rendered with ``dra.enabled``, its
``dra-admission.yaml`` applied, and kubectl as the admin or as another user."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from gpushare_hub.core.names import DRA_CAPACITY, DRA_DEVICE_CLASS, DRA_REQUEST
from gpushare_hub.localcluster import build
from gpushare_hub.localcluster.cluster import LocalCluster
from tests.conftest import running_cluster, wait_for

NS = "jupyterhub"  # the chart's dra.namespace by default: the hub's, where notebook pods run


@contextmanager
def dra_policies_cluster(helm: Any, chart: Path) -> Iterator[tuple[LocalCluster, Path]]:
    """A control plane with the hub's namespace and the chart's DRA admission policies (rendered
    as for 1.36 on an older pinned version, where the local cluster switches the gate on)."""
    with running_cluster(scheduler=False) as c:
        version = c.version()
        older = (int(version["major"]), int(version["minor"].rstrip("+"))) < (1, 36)
        render_as = "v1.36.0" if older else version["gitVersion"]
        c.create_namespace(NS)
        out = helm.run(
            "template",
            "gpushare-hub",
            str(chart),
            "--namespace=gpushare-hub",
            f"--kube-version={render_as}",
            "--set",
            "dra.enabled=true",
            "--show-only=templates/dra-admission.yaml",
        ).stdout
        path = Path(c.kubeconfig).parent / "dra-admission.yaml"
        path.write_text(out)
        proc = kubectl(c, "apply", "-f", str(path))
        assert proc.returncode == 0, proc.stderr
        yield c, path


def kubectl(
    c: LocalCluster, *args: str, kubeconfig: Path | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [str(build.bin_dir() / "kubectl"), f"--kubeconfig={kubeconfig or c.kubeconfig}", *args]
    return subprocess.run(argv, capture_output=True, text=True, input=stdin, timeout=60)


def claim(name: str, memory: str | None, count: int = 1, namespace: str = NS) -> dict[str, Any]:
    """A ResourceClaim of our class with the one request a catalogue template has."""
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
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": DRA_REQUEST, "exactly": exactly}]}},
    }


def template_of(body: dict[str, Any]) -> dict[str, Any]:
    """The ResourceClaimTemplate that makes claims like ``body``."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": body["metadata"],
        "spec": {"spec": body["spec"]},
    }


def create(
    c: LocalCluster, obj: dict[str, Any], kubeconfig: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return kubectl(c, "create", "-f", "-", kubeconfig=kubeconfig, stdin=yaml.safe_dump(obj))


def refused_eventually(c: LocalCluster, obj: dict[str, Any], kubeconfig: Path | None = None) -> str:
    """The policies take effect a moment after they are created: try until refused (60 s; an
    object accepted meanwhile is deleted again). The refusal's stderr."""

    def attempt() -> str:
        proc = create(c, obj, kubeconfig=kubeconfig)
        if proc.returncode != 0:
            return proc.stderr
        kubectl(c, "delete", "-f", "-", stdin=yaml.safe_dump(obj))
        return ""

    err = wait_for(attempt, timeout=60, every=0.5)
    assert err, f"{obj['kind']} {obj['metadata']['name']} was accepted for 60 s"
    return str(err)
