"""Test tiers: each folder of tests/ is one tier and carries that tier's marker (listed, with what
is real in each, under ``markers`` in pyproject.toml).

The local-cluster fixtures live here so that every tier that needs the real control plane
(cluster, kubelet) shares one per session; they start nothing until a test asks for them.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare_hub.localcluster import build
from gpushare_hub.localcluster.cluster import LocalCluster

# Fixtures and helpers the tiers share (tests/support/), registered once: the hub service's test
# stand-in, the session's hub and notebook nodes (hub, browser and fuzz tiers: one of each per
# session), each tier's time for `make test`'s table, and the failures that keep a cluster's
# work folder.
pytest_plugins = [
    "tests.support.hubservice",
    "tests.support.hub_session",
    "tests.support.timing",
    "tests.support.workdirs",
]


def wait_for(fn: Any, timeout: float = 90.0, every: float = 0.2) -> Any:
    """Poll ``fn`` until it returns something truthy (returned) or ``timeout`` passes (its last value).

    The limit is for a loaded 2-core machine (a cold `make test` builds beside the tiers): it costs
    nothing while the test passes, and a wait that holds only on a quiet machine is a bug."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every)


TIERS = ("unit", "cluster", "kubelet", "hub", "browser", "chart", "bench", "node")
# The node tier runs in a session of its own (`pytest tests/node`; `make test` runs it beside the
# cluster and kubelet tiers at the newest version): it pins the newest version for its whole session.
collect_ignore = ["node"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        rel = Path(str(item.fspath)).relative_to(root)
        tier = rel.parts[0] if len(rel.parts) > 1 else None
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


_CLUSTERS: list[LocalCluster] = []


@contextlib.contextmanager
def running_cluster(scheduler: bool = True) -> Iterator[LocalCluster]:
    """A started control plane (with the default scheduler unless told not to), whose logs a
    failing test's report lists; everything stops on exit."""
    # A plugin of this file's (pytest_plugins): imported once pytest registered it.
    from tests.support.workdirs import kept_only_if_failing

    try:
        build.build(only=list(build.GROUPS["control-plane"]))
    except build.BuildError as err:
        pytest.fail(f"cannot build the local cluster's binaries: {err}", pytrace=False)
    with LocalCluster(keep_workdir=True) as cluster, kept_only_if_failing(cluster):
        _CLUSTERS.append(cluster)
        try:
            cluster.start()
            if scheduler:
                cluster.start_scheduler()
            yield cluster
        finally:
            _CLUSTERS.remove(cluster)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[LocalCluster]:
    """One control plane with the default scheduler and three 2x Tesla T4 kwok nodes."""
    with running_cluster() as cluster:
        cluster.add_gpu_nodes(3, cards=2)
        yield cluster


class Gpushare:
    """The extender and its dedicated scheduler(s) running in the session cluster."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.extender, self.scheduler = cluster.start_gpushare_scheduler("binpack", "gpushare-scheduler")
        self._spread: tuple[Any, Any] | None = None

    @property
    def url(self) -> str:
        return str(self.extender.url)

    def spread(self) -> str:
        """A second extender + scheduler pair with the spread policy; returns its scheduler name."""
        if self._spread is None:
            from gpushare_hub.extender.schedconfig import extender_entry, profile

            ext = self.cluster.start_extender("spread", name="gpushare-extender-spread")
            sched = self.cluster.start_scheduler(
                "gpushare-spread",
                extenders=[extender_entry(f"{ext.url}/gpushare-scheduler", prioritize=True)],
                profile=profile("gpushare-spread", policy="spread"),
            )
            self._spread = (ext, sched)
        return "gpushare-spread"

    def restart_extender(self, kill: bool = True) -> None:
        port = self.extender.port
        if kill:
            self.extender.kill()
        else:
            self.extender.stop()
        self.extender = self.cluster.start_extender("binpack", port=port)


@pytest.fixture(scope="session")
def gpushare(local_cluster: LocalCluster) -> Gpushare:
    return Gpushare(local_cluster)


@pytest.fixture
def node_group(local_cluster: LocalCluster):
    """Make nodes for one test only: ``node_group(count, cards)`` -> (names, nodeSelector)."""

    def make(count: int, cards: int = 2, **kw: Any) -> tuple[list[str], dict[str, str]]:
        group = f"g{uuid.uuid4().hex[:6]}"
        names = local_cluster.add_gpu_nodes(
            count, cards=cards, prefix=f"{group}-", labels={"test-group": group}, **kw
        )
        return names, {"test-group": group}

    return make


@pytest.fixture
def namespace(local_cluster: LocalCluster) -> Iterator[str]:
    """A fresh namespace per test, so tests never see each other's pods.

    Its pods are deleted at once when the test ends (grace 0), then the namespace: a pod left
    behind keeps counting against its node's ``aliyun.com/gpu-mem`` in kube-scheduler, and the
    default scheduler may have put it on a shared node such as the hub tier's notebook nodes
    (a leftover 3 GiB pod there once made a later binpack test place a notebook elsewhere).
    """
    name = f"t-{uuid.uuid4().hex[:8]}"
    local_cluster.create_namespace(name)
    yield name
    api = local_cluster.core_api()
    try:
        api.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        api.delete_namespace(name)
    except Exception as err:  # an API server a fault test left down: nothing more to clean
        print(f"[namespace fixture] could not clean up namespace {name}: {err}")


def gpu_pod(
    name: str,
    units: int | str,
    scheduler: str | None = None,
    selector: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
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
    if selector:
        body["spec"]["nodeSelector"] = selector
    return body


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and _CLUSTERS:
        lines = [f"{name}: {path}" for c in _CLUSTERS for name, path in c.log_paths().items()]
        report.sections.append(("local cluster logs", "\n".join(lines)))
