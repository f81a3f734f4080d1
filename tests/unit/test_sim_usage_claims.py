"""The demo's usage: local notebook processes claim the memory they hold (the fake torch writes
``<pid>.json``), and the simulated backend reports those claims beside the usage file's, mapped to
their pods like a real node's processes; claims of processes that are gone, or that cannot be
read, are left out (the latter with one warning each, no traceback)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from gpushare_hub.isolation.usage import pod_uid_of_cgroup
from gpushare_hub.localcluster.nodeagent import sim_usage_env
from gpushare_hub.plugin.app import GPUShareDevicePlugin
from gpushare_hub.plugin.backends import Claim, SimulatedBackend, read_claims

POD = "1b2c3d4e-0000-4000-8000-000000000001"


def gone_pid() -> int:
    """A PID whose process has ended (and was reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write(folder: Path, name: str, body: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return path


def test_live_claims_are_read_and_gone_or_broken_ones_are_left_out_with_the_reason(tmp_path):
    me = os.getpid()
    write(tmp_path, f"{me}.json", {"card": "GPU-a", "pod": POD, "mib": 3072})
    write(tmp_path, f"{gone_pid()}.json", {"card": "GPU-a", "pod": POD, "mib": 9000})
    write(tmp_path, f"{os.getppid()}.json", "{not json")
    write(tmp_path, "notes.json", {"card": "GPU-a", "mib": 1})
    claims, problems = read_claims(tmp_path)
    assert claims == [Claim(me, "GPU-a", POD, 3072)]
    assert set(problems) == {str(tmp_path / f"{os.getppid()}.json"), str(tmp_path / "notes.json")}
    assert "its name is not <pid>.json" in problems[str(tmp_path / "notes.json")]


def test_every_field_of_a_claim_is_checked(tmp_path):
    cases = {
        "[1, 2]": "not a JSON object",
        '{"pod": "p", "mib": 1}': "no card UUID",
        '{"card": "", "mib": 1}': "no card UUID",
        '{"card": "GPU-a", "pod": 5, "mib": 1}': "pod is not a UID string",
        '{"card": "GPU-a", "mib": -1}': "mib is not a whole number of MiB",
        '{"card": "GPU-a", "mib": true}': "mib is not a whole number of MiB",
        '{"card": "GPU-a", "mib": 1.5}': "mib is not a whole number of MiB",
        '{"card": "GPU-a", "mib": 1, "x": "' + "a" * 5000 + '"}': "more than 4096 bytes",
        '{"card": "GPU-a", "mib": 1, "util": 101}': "util is not a whole percent from 0 to 100",
        '{"card": "GPU-a", "mib": 1, "util": "40"}': "util is not a whole percent from 0 to 100",
    }
    for body, problem in cases.items():
        path = write(tmp_path, "1.json", body)  # PID 1 lives
        claims, problems = read_claims(tmp_path, alive=lambda pid: True)
        assert claims == [] and problem in problems[str(path)], (body, problems)
        assert (
            'write {"card": "<uuid>", "pod": "<pod UID>", "mib": <n>, "util": <0-100>}' in problems[str(path)]
        )
    write(tmp_path, "1.json", {"card": "GPU-a", "mib": 0})
    assert read_claims(tmp_path, alive=lambda pid: True) == ([Claim(1, "GPU-a", "", 0)], {})
    write(tmp_path, "1.json", {"card": "GPU-a", "mib": 612, "util": 40})
    assert read_claims(tmp_path, alive=lambda pid: True) == ([Claim(1, "GPU-a", "", 612, 40)], {})


def test_the_backend_adds_the_claims_to_the_usage_file_and_maps_them_to_their_pods(tmp_path, caplog):
    backend = SimulatedBackend(
        "1x Tesla T4:15360", "nb-1", usage_file=tmp_path / "usage.json", claims_dir=tmp_path / "claims"
    )
    card = backend.cards[0].uuid
    write(tmp_path, "usage.json", [{"card": card, "command": "nvidia-cuda-mps-server", "mib": 30}])
    write(tmp_path / "claims", f"{os.getpid()}.json", {"card": card, "pod": POD, "mib": 3072})
    broken = write(tmp_path / "claims", f"{os.getppid()}.json", '{"card": 7}')
    with caplog.at_level(logging.WARNING, logger="gpushare.plugin"):
        first = backend.processes()
        second = backend.processes()
    assert first == second
    declared, claimed = first
    assert (declared.card, declared.used_mib, declared.command) == (card, 30, "nvidia-cuda-mps-server")
    assert (claimed.card, claimed.pid, claimed.used_mib) == (card, os.getpid(), 3072)
    assert pod_uid_of_cgroup(claimed.cgroup) == POD
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info is None  # once, across both polls
    assert f"usage claim {broken} is ignored: no card UUID" in warnings[0].getMessage()


def test_a_backend_without_a_claims_folder_or_with_a_missing_one_reports_only_the_usage_file(tmp_path):
    assert SimulatedBackend("1x Tesla T4:15360", "nb-1").processes() == []
    backend = SimulatedBackend("1x Tesla T4:15360", "nb-1", claims_dir=tmp_path / "not-there")
    assert backend.processes() == []


def test_the_plugin_option_and_the_node_agents_environment_name_the_same_folder(tmp_path):
    app = GPUShareDevicePlugin()
    app.parse_command_line(
        ["--backend=simulated", "--simulate=1x Tesla T4:15360", f"--usage-claims-dir={tmp_path}"]
    )
    backend = app.make_backend()
    assert isinstance(backend, SimulatedBackend) and backend.claims_dir == tmp_path
    assert sim_usage_env(tmp_path, POD) == {
        "GPUSHARE_SIM_USAGE_DIR": str(tmp_path),
        "GPUSHARE_SIM_POD_UID": POD,
    }
