"""The plugin's check of its node's claimed tier: the probe's environment, the verdict on the
self-test's JSON, and what is published (the check beside the tier; a Warning when it failed)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from gpushare_hub.core.cards import Card
from gpushare_hub.core.names import ISOLATION_CHECK_ANNOTATION, ISOLATION_CHECK_REASON
from gpushare_hub.plugin.response import HOOK_CONTAINER_PATH, Isolation
from gpushare_hub.plugin.selfcheck import check_node, probe_env, read_result

UUID = "GPU-0f0f0f0f-1111-2222-3333-444455556666"
CARD = Card(0, UUID, "Tesla-T4", 15, 15360)


class Sink:
    def __init__(self) -> None:
        self.annotations: list[dict[str, str | None]] = []
        self.warnings: list[tuple[str, str]] = []

    def annotate_node(self, node: str, annotations: dict[str, str | None]) -> None:
        self.annotations.append(annotations)

    def warn_node(self, reason: str, message: str) -> None:
        self.warnings.append((reason, message))


def result(observed: str, held: bool = True, frameworks: list[dict] | None = None) -> str:
    fws = frameworks if frameworks is not None else [{"name": "torch", "held": held, "stopped_at_mib": 1024}]
    return json.dumps({"observed_tier": observed, "ok": True, "frameworks": fws, "slice_mib": 1024})


def test_the_probe_gets_a_one_unit_slice_with_paths_as_the_plugin_sees_them():
    iso = Isolation(hook_host_path="/var/lib/gpushare-hub/pyhook", mps=True, mps_root="/run/mps", tier="mps")
    env = probe_env(CARD, 1024, iso, {"PATH": "/usr/bin"})
    assert env["PATH"] == "/usr/bin" and env["GPUSHARE_MEMORY_LIMIT_MIB"] == "1024"
    assert env["PYTHONPATH"] == "/var/lib/gpushare-hub/pyhook" != HOOK_CONTAINER_PATH
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == f"/run/mps/{UUID}/pipe"
    assert env["GPUSHARE_ISOLATION_TIER"] == "mps" and "NVIDIA_GPU_MEMORY_LIMITS" not in env
    assert env["NVIDIA_VISIBLE_DEVICES"] == UUID


def test_a_claim_holds_when_the_test_saw_that_tier_or_a_harder_one_for_cooperative():
    assert read_result("mps", result("mps"), "t").check.ok
    assert read_result("cooperative", result("cooperative"), "t").check.ok
    assert read_result("cooperative", result("driver"), "t").check.ok
    failed = read_result("mps", result("cooperative"), "t").check
    assert not failed.ok and failed.observed == "cooperative" and failed.claimed == "mps"
    assert failed.detail == "torch: held at 1024 MiB"
    assert not read_result("cooperative", result("none", held=False), "t").check.ok


def test_nothing_is_concluded_when_no_framework_could_be_tried_or_the_output_is_not_json():
    none = read_result("mps", result("unknown", frameworks=[]), "t")
    assert none.check is None and "no framework could be tried (none installed)" in none.said
    broken = read_result("mps", result("unknown", frameworks=[{"name": "torch", "error": "no CUDA"}]), "t")
    assert broken.check is None and "(torch)" in broken.said
    assert read_result("mps", "Traceback ...", "t").check is None


def fake_python(tmp_path, stdout: str):
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


def test_a_failed_check_is_published_beside_the_tier_and_warned_on_the_node(tmp_path):
    sink = Sink()
    iso = Isolation(hook_host_path="", mps=True, tier="mps")
    check = check_node("gpu-1", CARD, 1024, iso, fake_python(tmp_path, result("cooperative")), sink)
    assert check is not None and not check.ok
    (published,) = sink.annotations
    doc = json.loads(published[ISOLATION_CHECK_ANNOTATION] or "")
    assert doc["claimed"] == "mps" and doc["observed"] == "cooperative" and doc["ok"] is False
    ((reason, message),) = sink.warnings
    assert reason == ISOLATION_CHECK_REASON
    assert message.startswith("node gpu-1 claims mps isolation, but its self-test observed cooperative")


def test_a_passed_check_is_published_without_a_warning_and_an_untried_one_not_at_all(tmp_path):
    sink = Sink()
    iso = Isolation(hook_host_path="", tier="cooperative")
    assert check_node("gpu-1", CARD, 1024, iso, fake_python(tmp_path, result("cooperative")), sink).ok
    assert len(sink.annotations) == 1 and sink.warnings == []
    quiet = Sink()
    assert (
        check_node("gpu-1", CARD, 1024, iso, fake_python(tmp_path, result("x", frameworks=[])), quiet) is None
    )
    assert quiet.annotations == [] and quiet.warnings == []
    assert check_node("gpu-1", CARD, 1024, iso, os.devnull + "/missing", quiet) is None


def test_the_probe_takes_the_freest_card_and_none_where_it_would_crowd_the_slices_held():
    from gpushare_hub.plugin.selfcheck import probe_card

    a, b = Card(0, "GPU-a", "Tesla-T4", 15, 15360), Card(1, "GPU-b", "Tesla-T4", 15, 15360)
    assert probe_card([a, b], {}, 1024) == a  # equal room: the first card
    assert probe_card([a, b], {"GPU-a": 10}, 1024) == b
    assert probe_card([a, b], {"GPU-a": 14, "GPU-b": 14}, 1024) is None  # 1 GiB free: too little


def test_a_self_test_that_outlives_its_time_is_killed_with_its_children(tmp_path):
    import subprocess
    import time

    import pytest

    from gpushare_hub.plugin.selfcheck import run_selftest

    script = tmp_path / "python"
    pidfile = tmp_path / "child.pid"
    script.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pidfile}\nwait\n")
    script.chmod(0o755)
    with pytest.raises(subprocess.TimeoutExpired):
        run_selftest(str(script), {"PATH": os.environ["PATH"]}, timeout=1)
    child = int(pidfile.read_text())
    time.sleep(0.2)
    stat_file = Path(f"/proc/{child}/stat")
    assert not stat_file.exists() or stat_file.read_text().split()[2] == "Z"  # gone, or a zombie
