"""Test clusters keep their work folders (logs, etcd, certificates, manifests) only when a test
failed while they ran: a failing test's report lists the logs there, and a passing run leaves
nothing behind in /tmp. Registered once through ``pytest_plugins`` in ``tests/conftest.py``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from gpushare_hub.localcluster.cluster import LocalCluster

_FAILED = [0]  # reports of this session that failed: setup, call or teardown


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _FAILED[0] += 1


@contextlib.contextmanager
def kept_only_if_failing(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """Around a started ``LocalCluster(keep_workdir=True)``: when the block ends with no test
    failed since it began, the folder goes with the cluster; when a test failed, or the block
    raised (the cluster did not start), it stays for its logs."""
    before = _FAILED[0]
    yield cluster
    cluster.keep_workdir = _FAILED[0] > before
