"""`make test`'s timing table (gpushare_hub.localcluster.timing): what each step records, how the
table reads it, and that a timed step keeps its command's exit status."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpushare_hub.localcluster import timing

SCRIPT = Path(timing.__file__)


def test_nothing_is_recorded_without_the_timing_file(tmp_path, monkeypatch):
    monkeypatch.delenv(timing.TIMING_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with timing.timed("Kubernetes v1.34.4") as step:
        step.cold = True
    assert list(tmp_path.iterdir()) == []


def test_a_timed_block_is_recorded_cold_or_cached_and_also_when_it_raises(tmp_path, monkeypatch):
    path = tmp_path / "out" / "timing.tsv"
    monkeypatch.setenv(timing.TIMING_ENV, str(path))
    with timing.timed("Kubernetes v1.34.4") as step:
        step.cold, step.note = True, "kube-apiserver kubectl"
    with timing.timed("CoreDNS v1.14.7"):
        pass
    with pytest.raises(RuntimeError), timing.timed("helm v3.19.5") as step:
        step.cold = True
        raise RuntimeError("go build failed")
    lines = timing.read(path)
    assert [(x.kind, x.name, x.state, x.note) for x in lines] == [
        ("build", "Kubernetes v1.34.4", "cold", "kube-apiserver kubectl"),
        ("build", "CoreDNS v1.14.7", "cached", ""),
        ("build", "helm v3.19.5", "cold", ""),
    ]
    assert all(x.seconds >= 0 for x in lines)


def test_a_line_reads_back_as_written_and_foreign_lines_are_skipped(tmp_path):
    line = timing.Line("tier", "cluster @ v1.37.2", "41", 1700000000.0, 125.5, "a\tnote\nover lines")
    path = tmp_path / "t.tsv"
    path.write_text("not a timing line\n" + line.text() + "tier\tx\t1\tnot-a-time\t1\t\n")
    (back,) = timing.read(path)
    assert (back.kind, back.name, back.state, back.start, back.seconds) == (
        "tier", "cluster @ v1.37.2", "41", 1700000000.0, 125.5,
    )  # fmt: skip
    assert back.note == "a note over lines"


def test_a_step_asked_for_many_times_is_one_row_cold_if_any_built():
    lines = [
        timing.Line("build", "Kubernetes v1.34.4", "cached", 10.0, 0.0),
        timing.Line("build", "Kubernetes v1.34.4", "cold", 20.0, 300.0, "kube-apiserver"),
        timing.Line("build", "Kubernetes v1.34.4", "cached", 400.0, 0.5),
        timing.Line("tier", "unit", "800", 500.0, 90.0),
        timing.Line("tier", "unit", "10", 900.0, 5.0),
    ]
    rows = timing.merged(lines)
    assert [(x.kind, x.name, x.state, x.seconds, x.note) for x in rows] == [
        ("build", "Kubernetes v1.34.4", "cold", 300.5, "kube-apiserver"),
        ("tier", "unit", "800", 90.0, ""),
        ("tier", "unit", "10", 5.0, ""),
    ]


def test_the_table_shows_each_step_the_wall_time_and_side_by_side_steps_once():
    lines = [
        timing.Line("build", "venv", "cached", 0.0, 1.0),
        timing.Line("build", "Kubernetes v1.37.2", "cold", 10.0, 100.0),  # beside the session
        timing.Line("session", "pytest tests", "900", 20.0, 200.0),
        timing.Line("tier", "hub", "120", 20.0, 150.0),
        timing.Line("slow", "tests/hub/test_budgets.py::test_spent", "", 30.0, 61.0, "Stops the server."),
    ]
    text = timing.table(lines)
    assert "Kubernetes v1.37.2" in text and "cold" in text and "100.0" in text
    assert "hub" in text and "150.0" in text
    # Each row says when it started, after the run's first step: the session beside the build.
    assert re.search(r"pytest tests +900 +\+20 +200\.0", text), text
    assert re.search(r"Kubernetes v1\.37\.2 +cold +\+10 +100\.0", text), text
    assert "make test: 220 s from its first step's start" in text
    assert "(211 s covered by the steps above" in text
    assert "61.0  tests/hub/test_budgets.py::test_spent" in text and "Stops the server." in text


def _step(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", timing.TIMING_ENV: str(tmp_path / "t.tsv")}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "step", *args], env=env, capture_output=True, text=True
    )


def test_a_step_keeps_its_commands_exit_status_and_is_recorded_either_way(tmp_path):
    assert (
        _step(tmp_path, "Debian packages", "--cached-if", "false", "--", "sh", "-c", "exit 3").returncode == 3
    )
    assert _step(tmp_path, "venv", "--cached-if", "true", "--", "true").returncode == 0
    assert _step(tmp_path, "ruff", "--kind", "check", "--", "true").returncode == 0
    lines = timing.read(tmp_path / "t.tsv")
    assert [(x.kind, x.name, x.state, x.note) for x in lines] == [
        ("build", "Debian packages", "cold", "(failed: exit 3)"),
        ("build", "venv", "cached", ""),
        ("check", "ruff", "ran", ""),
    ]


def test_a_step_without_a_command_is_refused(tmp_path):
    done = _step(tmp_path, "venv")
    assert done.returncode == 2 and "after --" in done.stderr
    assert not (tmp_path / "t.tsv").exists()
