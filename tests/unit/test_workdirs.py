"""A test cluster's work folder stays only when a test failed while it ran (tests/support/workdirs.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.support import workdirs


def report(failed: bool) -> pytest.TestReport:
    return SimpleNamespace(failed=failed)  # type: ignore[return-value]


@pytest.fixture(autouse=True)
def own_count(monkeypatch):
    """This session's own count stays as it is: the failure reported here is made up (a cluster
    of this session counting it would keep its folder)."""
    monkeypatch.setattr(workdirs, "_FAILED", [0])


def test_a_cluster_whose_tests_passed_loses_its_folder_and_one_with_a_failure_keeps_it():
    quiet = SimpleNamespace(keep_workdir=True)
    with workdirs.kept_only_if_failing(quiet):  # type: ignore[arg-type]
        workdirs.pytest_runtest_logreport(report(False))
    assert quiet.keep_workdir is False

    failing = SimpleNamespace(keep_workdir=True)
    with workdirs.kept_only_if_failing(failing):  # type: ignore[arg-type]
        workdirs.pytest_runtest_logreport(report(True))
    assert failing.keep_workdir is True


def test_a_cluster_that_did_not_start_keeps_its_folder_for_its_logs():
    broken = SimpleNamespace(keep_workdir=True)
    with pytest.raises(RuntimeError), workdirs.kept_only_if_failing(broken):  # type: ignore[arg-type]
        raise RuntimeError("the API server did not start")
    assert broken.keep_workdir is True
