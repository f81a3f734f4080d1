"""Node tier: our chart and Zero to JupyterHub as containers under real kubelets.

One local control plane with one real node (kubelet, containerd 2 with CDI and the NVIDIA container
toolkit's runtime built from their Go modules, Debian's runc, kube-proxy,
CoreDNS; :mod:`gpushare_hub.localcluster.realnodes`), at the newest pinned Kubernetes version,
for the whole tier; a second node, set up in the toolkit's legacy mode, joins half-way. The tests
run in file order and build on each other: install, spawn, upgrade, restart, uninstall, as an
admin would.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare_hub.localcluster import build
from gpushare_hub.localcluster.cluster import LocalCluster
from gpushare_hub.localcluster.processes import HarnessError
from gpushare_hub.localcluster.realstack import RealStack
from gpushare_hub.localcluster.runtimebuild import build_coredns
from tests.conftest import _CLUSTERS
from tests.support.workdirs import kept_only_if_failing

NEWEST = build.Versions.all()[-1].kubernetes


@pytest.fixture(scope="session", autouse=True)
def newest_kubernetes() -> Iterator[None]:
    """The node tier runs on the newest pinned Kubernetes (its binaries, its kube-scheduler image)."""
    before = os.environ.get(build.VERSION_ENV)
    os.environ[build.VERSION_ENV] = NEWEST
    yield
    if before is None:
        os.environ.pop(build.VERSION_ENV, None)
    else:
        os.environ[build.VERSION_ENV] = before


@pytest.fixture(scope="session")
def stack(newest_kubernetes: None) -> Iterator[RealStack]:
    try:
        build.build()
        build_coredns()
    except build.BuildError as err:
        pytest.fail(f"cannot build the local cluster's binaries: {err}", pytrace=False)
    with LocalCluster(real_nodes=True, keep_workdir=True) as cluster, kept_only_if_failing(cluster):
        _CLUSTERS.append(cluster)
        try:
            cluster.start()
            cluster.start_scheduler()
            yield RealStack.start(cluster, 1)
        except HarnessError as err:
            pytest.fail(str(err), pytrace=False)
        finally:
            _CLUSTERS.remove(cluster)


class Hub:
    """Zero to JupyterHub's REST API through the proxy, with the admin token of the ready file."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        req.add_header("Authorization", f"token {token or self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                status = resp.status
        except urllib.error.HTTPError as err:
            raw = err.read()
            status = err.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")
