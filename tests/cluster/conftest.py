"""Cluster tier: real etcd, kube-apiserver, kube-scheduler and kwok, built from pinned sources.

The binaries are built (or reused from the cache) before the first test; a
failing test's report lists where each component's log is.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare_hub.localcluster import build
from gpushare_hub.localcluster.cluster import LocalCluster

_CLUSTERS: list[LocalCluster] = []


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """One control plane with the default scheduler and three 2x Tesla T4 kwok nodes."""
    try:
        build.build()
    except build.BuildError as err:
        pytest.fail(f"cannot build the local cluster's binaries: {err}", pytrace=False)
    with LocalCluster(keep_workdir=True) as cluster:
        _CLUSTERS.append(cluster)
        cluster.start()
        cluster.start_scheduler()
        cluster.add_gpu_nodes(3, cards=2)
        yield cluster
        _CLUSTERS.remove(cluster)


@pytest.fixture
def namespace(local_cluster: LocalCluster) -> str:
    """A fresh namespace per test, so tests never see each other's pods."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    local_cluster.core_api().create_namespace({"metadata": {"name": name}})
    return name


def gpu_pod(name: str, units: int | str, scheduler: str | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "notebook",
                    "image": "quay.io/jupyter/base-notebook",
                    "resources": {"limits": {"aliyun.com/gpu-mem": str(units)}},
                }
            ],
            **spec,
        },
    }
    if scheduler:
        body["spec"]["schedulerName"] = scheduler
    return body


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and _CLUSTERS:
        lines = [f"{name}: {path}" for c in _CLUSTERS for name, path in c.log_paths().items()]
        report.sections.append(("local cluster logs", "\n".join(lines)))
