"""The GPU measurement's pure parts: the environment it gives a probe, its table, and its refusal
without NVML (this machine has none; `gpushare-bench isolation` runs on a real GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gpushare_hub.bench.isolation_measure import slice_env, table
from gpushare_hub.plugin.backends import DiscoveredCard

CARD = DiscoveredCard(
    uuid="GPU-3cc7cb56-9eed-90be-33b3-e7b0157aeeee", index=0, model="NVIDIA-H100-80GB-HBM3", mib=81559
)


def test_a_probe_gets_what_allocate_returns_with_this_machines_paths():
    env = slice_env(CARD, 4, "/tmp/hook", None)
    assert env["PYTHONPATH"] == "/tmp/hook"  # the container's /opt/gpushare-hub/pyhook, here
    assert env["CUDA_VISIBLE_DEVICES"] == CARD.uuid == env["NVIDIA_VISIBLE_DEVICES"]
    assert env["GPUSHARE_MEMORY_LIMIT_MIB"] == "4096" and env["GPUSHARE_CARD_MEMORY_MIB"] == "81559"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.050"
    assert "XLA_CLIENT_MEM_FRACTION" not in env  # JAX 0.11 runs on the CPU when both are set
    assert env["CUPY_GPU_MEMORY_LIMIT"] == str(4 * 2**30)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in env

    plain = slice_env(CARD, 8, None, None)
    assert "PYTHONPATH" not in plain and plain["GPUSHARE_MEMORY_LIMIT_MIB"] == "8192"

    mps = slice_env(CARD, 8, "/tmp/hook", "/tmp/mps/pipe")
    assert mps["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/mps/pipe"
    assert mps["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"


def test_the_table_says_what_held_and_what_did_not():
    result = {
        "cards": [{"index": 0, "uuid": CARD.uuid, "model": CARD.model, "mib": CARD.mib}],
        "runs": [
            {
                "mode": "env",
                "slice_gib": 4,
                "framework": "torch",
                "held_mib": 10240,
                "total_mib": 81080,
                "capped": False,
                "error": "",
                "nvml_sees_process": True,
                "nvml_used_mib": 10758,
            },
            {
                "mode": "hook",
                "slice_gib": 4,
                "framework": "torch",
                "held_mib": 3840,
                "total_mib": 81080,
                "capped": True,
                "error": "CUDA out of memory",
            },
            {
                "mode": "env",
                "slice_gib": 4,
                "framework": "jax",
                "held_mib": 0,
                "total_mib": None,
                "capped": False,
                "error": "RuntimeError: JAX runs on cpu, not the GPU",
            },
        ],
    }
    lines = table(result).splitlines()
    assert CARD.uuid in lines[0] and "81559 MiB" in lines[0]
    env_torch, hook_torch, jax = lines[-3:]
    assert (
        "10.00" in env_torch and "NOT capped" in env_torch and "NVML sees it: True (10758 MiB)" in env_torch
    )
    assert "3.75" in hook_torch and "capped (refused the next block)" in hook_torch
    assert "error: RuntimeError: JAX runs on cpu" in jax


def test_without_nvml_it_says_so_and_exits_1():
    done = subprocess.run(
        [str(Path(sys.executable).with_name("gpushare-bench")), "isolation", "--json"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "NVML" in json.loads(done.stdout)["error"]
    assert "no GPU could be read" in done.stderr


def test_bad_slices_are_refused_naming_the_flag():
    done = subprocess.run(
        [str(Path(sys.executable).with_name("gpushare-bench")), "isolation", "--slices", "four"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--slices 'four'" in done.stderr
