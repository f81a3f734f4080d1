"""Each tier's time in a pytest session (tests/support/timing.py): recorded per folder of tests/
for `make test`'s table, the slow tests with what their docstring says they prove."""

from __future__ import annotations

import pytest

from gpushare_hub.localcluster import timing
from tests.support import timing as tier_timing

pytest_plugins = ["pytester"]
INI = '[tool.pytest.ini_options]\nasyncio_default_fixture_loop_scope = "function"\n'


def test_a_session_records_each_tier_its_tests_and_the_slow_ones(pytester, monkeypatch, tmp_path):
    path = tmp_path / "timing.tsv"
    monkeypatch.setenv(timing.TIMING_ENV, str(path))
    monkeypatch.delenv("GPUSHARE_K8S_VERSION", raising=False)
    monkeypatch.setattr(tier_timing, "SLOW_SECONDS", 0.2)
    pytester.makepyprojecttoml(INI)
    for tier in ("unit", "hub"):
        (pytester.path / "tests" / tier).mkdir(parents=True)  # no packages: ours is `tests`
    (pytester.path / "tests/unit/test_fast.py").write_text(
        "def test_a():\n    pass\n\ndef test_b():\n    pass\n"
    )
    (pytester.path / "tests/hub/test_slow.py").write_text(
        "import time\n\ndef test_waits():\n"
        "    '''Proves the hub waits.\n\n    More.'''\n    time.sleep(0.3)\n"
    )
    result = pytester.runpytest("-p", "no:cacheprovider", plugins=[tier_timing])
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*time per tier*", "hub * 1 tests *", "unit * 2 tests *"])  # in run order
    lines = timing.read(path)
    tiers = {x.name: x for x in lines if x.kind == "tier"}
    assert {name: x.state for name, x in tiers.items()} == {"unit": "2", "hub": "1"}
    assert tiers["hub"].seconds >= 0.3
    (session,) = [x for x in lines if x.kind == "session"]
    assert session.state == "3" and session.seconds >= tiers["hub"].seconds
    (slow,) = [x for x in lines if x.kind == "slow"]
    assert slow.name == "tests/hub/test_slow.py::test_waits" and slow.note == "Proves the hub waits."


def test_nothing_is_written_without_the_timing_file(pytester, monkeypatch):
    monkeypatch.delenv(timing.TIMING_ENV, raising=False)
    pytester.makepyprojecttoml(INI)
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider", plugins=[tier_timing])
    result.assert_outcomes(passed=1)
    assert sorted(p.name for p in pytester.path.iterdir()) == ["pyproject.toml", "test_one.py"]


@pytest.mark.parametrize("version", ["v1.37.2"])
def test_a_session_at_another_kubernetes_version_is_labelled(pytester, monkeypatch, tmp_path, version):
    path = tmp_path / "timing.tsv"
    monkeypatch.setenv(timing.TIMING_ENV, str(path))
    monkeypatch.setenv("GPUSHARE_K8S_VERSION", version)
    pytester.makepyprojecttoml(INI)
    (pytester.path / "tests" / "cluster").mkdir(parents=True)
    (pytester.path / "tests/cluster/test_c.py").write_text("def test_c():\n    pass\n")
    pytester.runpytest("-p", "no:cacheprovider", plugins=[tier_timing]).assert_outcomes(passed=1)
    assert [x.name for x in timing.read(path) if x.kind == "tier"] == [f"cluster @ {version}"]
