"""The MPS control-daemon DaemonSets: rendered from values, and their script run against stubs.

The script runs here with stand-ins for the driver's nvidia-smi and nvidia-cuda-mps-control and
for unshare/mount (no card, no mount namespace needed): what it creates under the MPS root and
what each daemon is started with must match the layout the device plugin mounts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from gpushare_hub.core import computeshare
from gpushare_hub.core.cards import Card
from gpushare_hub.core.names import MPS_LABEL, MPS_MULTI_USER_LABEL
from gpushare_hub.plugin.matching import Waiting
from gpushare_hub.plugin.response import MPS_ROOT, Isolation, container_response
from tests.conftest import wait_for

from .conftest import CHART, KUBE_VERSION, Helm

SCRIPT = CHART / "files" / "mps-control-daemon.sh"
SINGLE, MULTI = "gpushare-mps-control-daemon", "gpushare-mps-control-daemon-multi-user"
CARDS = ("GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000")


def daemonsets(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet" and "mps" in d["metadata"]["name"]
    }


def env_of(ds: dict[str, Any]) -> dict[str, str]:
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"]}


def test_off_by_default(helm: Helm):
    docs = helm.template()
    assert daemonsets(docs) == {}
    assert not [d for d in docs if "mps-control-daemon" in d["metadata"]["name"]]


def test_enabled_one_daemonset_per_mode_on_the_nodes_the_plugin_labels(helm: Helm):
    docs = helm.template(
        "--set", "mps.enabled=true", "--set", "mps.shmSize=1g", "--set", "mps.maxSliceMemory=7G",
        "--set", "devicePlugin.runtimeClassName=nvidia",
    )  # fmt: skip
    ds = daemonsets(docs)
    assert set(ds) == {SINGLE, MULTI}
    single, multi = (ds[n]["spec"]["template"]["spec"] for n in (SINGLE, MULTI))
    assert single["nodeSelector"] == {"gpushare": "true", MPS_LABEL: "true"}
    assert multi["nodeSelector"] == {"gpushare": "true", MPS_LABEL: "true", MPS_MULTI_USER_LABEL: "true"}
    (term,) = single["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [
        {"key": MPS_MULTI_USER_LABEL, "operator": "NotIn", "values": ["true"]}
    ]
    assert "affinity" not in multi
    assert env_of(ds[SINGLE])["MPS_MULTI_USER"] == "false"
    assert env_of(ds[MULTI])["MPS_MULTI_USER"] == "true"
    for pod in (single, multi):
        assert pod["runtimeClassName"] == "nvidia"
        assert pod["hostPID"] is True and pod["automountServiceAccountToken"] is False
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        (container,) = pod["containers"]
        assert container["image"] == "ghcr.io/gpushare-hub/gpushare-device-plugin:0.1.0"
        assert container["securityContext"] == {"privileged": True}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        # The same host folder as the plugin's --mps-root, at the same path.
        assert mounts["mps"]["mountPath"] == volumes["mps"]["hostPath"]["path"] == MPS_ROOT
        assert env_of({"spec": {"template": {"spec": pod}}})["MPS_ROOT"] == MPS_ROOT
    plugin = next(
        d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "gpushare-device-plugin"
    )
    assert f"--mps-root={MPS_ROOT}" in plugin["spec"]["template"]["spec"]["containers"][0]["args"]
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == SINGLE)
    assert cm["data"]["mps-control-daemon.sh"] == SCRIPT.read_text()


def test_its_own_image_root_and_tolerations_when_set(helm: Helm):
    docs = helm.template(
        "--set",
        "mps.enabled=true",
        "--set",
        "devicePlugin.mpsRoot=/run/mps",
        "--set",
        "mps.image.repository=example.org/mps",
        "--set",
        "mps.image.tag=v1",
        "--set-json",
        'mps.tolerations=[{"operator": "Exists"}]',
        "--set",
        "mps.shmSize=8g",
        "--set",
        "mps.maxSliceMemory=7G",
    )
    for ds in daemonsets(docs).values():
        pod = ds["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"] == "example.org/mps:v1"
        assert pod["tolerations"] == [{"operator": "Exists"}]
        assert env_of(ds)["MPS_ROOT"] == "/run/mps" and env_of(ds)["MPS_SHM_SIZE"] == "8g"


def test_mps_on_needs_a_size_for_each_cards_shared_memory(helm: Helm):
    """Every GPU container of an MPS card shares the card's shm folder, on the host: without a
    size, one notebook could fill the host's memory through it. The chart refuses MPS without
    mps.shmSize, naming the value; with it, each daemon mounts a tmpfs of that size there."""
    for unset in ((), ("--set", "mps.shmSize=")):
        proc = helm.run(
            "template", "x", str(CHART), f"--kube-version={KUBE_VERSION}",
            "--set", "mps.enabled=true", *unset, check=False,
        )  # fmt: skip
        assert proc.returncode != 0
        assert "mps.shmSize" in proc.stderr and "mps.enabled" in proc.stderr, proc.stderr
    docs = helm.template(
        "--set", "mps.enabled=true", "--set", "mps.shmSize=2g", "--set", "mps.maxSliceMemory=7G"
    )
    assert {n: env_of(ds)["MPS_SHM_SIZE"] for n, ds in daemonsets(docs).items()} == {
        SINGLE: "2g",
        MULTI: "2g",
    }
    assert daemonsets(helm.template("--set", "mps.shmSize=")) == {}  # MPS off: no size needed


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        (["--set", "mps.enabled=yes"], ["/mps/enabled", "boolean"]),
        (["--set", "mps.shmSize=8Gi"], ["/mps/shmSize", "pattern"]),
        (["--set-string", "mps.shmSize=0"], ["/mps/shmSize", "pattern"]),  # tmpfs size=0: no limit at all
        (["--set", "mps.multiUser=true"], ["/mps", "multiUser"]),
        (["--set", "mps.maxSliceMemory=7GiB"], ["/mps/maxSliceMemory", "pattern"]),
        (["--set", "mps.maxComputeShare=150"], ["/mps/maxComputeShare"]),
        (["--set-string", "mps.maxComputeShare=47%"], ["/mps/maxComputeShare"]),
    ],
    ids=[
        "wrong-type",
        "tmpfs-size",
        "tmpfs-unbounded",
        "unknown-key",
        "limit-unit",
        "share-over-100",
        "share-unit",
    ],
)
def test_the_schema_refuses_bad_mps_values(helm: Helm, setting, words):
    proc = helm.run("template", "x", str(CHART), *setting, check=False)
    assert proc.returncode != 0
    for word in words:
        assert word in proc.stderr, proc.stderr


STUBS = {
    # The driver's tools, logging what they are asked.
    "nvidia-smi": """
if [ "$1" = --query-gpu=uuid ]; then printf '%s\\n' $STUB_CARDS; exit 0; fi
# Each card's memory as NVML gives it: a T4 (15360 MiB), then an A10 (23028 MiB).
if [ "$3" = --query-gpu=memory.total ]; then
    case $2 in GPU-1*) echo 15360 ;; *) echo 23028 ;; esac
    exit 0
fi
echo "nvidia-smi $*" >> "$STUB_LOG"
""",
    "nvidia-cuda-mps-control": """
if [ "$1" = -d ]; then
    echo "daemon $* visible=$CUDA_VISIBLE_DEVICES pipe=$CUDA_MPS_PIPE_DIRECTORY" \\
        "log=$CUDA_MPS_LOG_DIRECTORY" >> "$STUB_LOG"
    touch "$CUDA_MPS_PIPE_DIRECTORY/control"
    exit 0
fi
read -r cmd
echo "control $cmd pipe=$CUDA_MPS_PIPE_DIRECTORY" >> "$STUB_LOG"
[ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] && echo 50
""",
    # No namespace here: run the command as it is; log the bind mount.
    "unshare": 'while [ "${1#-}" != "$1" ]; do shift; done; exec "$@"',
    "mount": 'echo "mount $*" >> "$STUB_LOG"',
    "mountpoint": "exit 1",
}


class ScriptRun:
    def __init__(
        self, tmp: Path, multi_user: bool, shm_size: str = "", max_slice: str = "", max_share: str = ""
    ) -> None:
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        for name, body in STUBS.items():
            (bin_dir / name).write_text("#!/bin/sh\n" + body)
            (bin_dir / name).chmod(0o755)
        self.root = tmp / "mps"
        self.log = tmp / "log"
        self.ready = tmp / "ready"
        env = {
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "MPS_ROOT": str(self.root),
            "MPS_MULTI_USER": "true" if multi_user else "false",
            "MPS_SHM_SIZE": shm_size,
            "MPS_CHECK_INTERVAL": "1",
            "MPS_DEFAULT_PINNED_MEM_LIMIT": max_slice,
            "MPS_DEFAULT_ACTIVE_THREAD_PERCENTAGE": max_share,
            "MPS_READY_FILE": str(self.ready),
            "STUB_CARDS": " ".join(CARDS),
            "STUB_LOG": str(self.log),
        }
        self.proc = subprocess.Popen(["sh", str(SCRIPT)], env=env, stderr=subprocess.PIPE, text=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 20
        while not self.ready.exists():
            assert self.proc.poll() is None, self.proc.communicate()[1]
            assert time.monotonic() < deadline, "the script never became ready"
            time.sleep(0.05)

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.mark.parametrize("multi_user", [False, True])
def test_the_script_starts_one_daemon_per_card_where_the_plugin_mounts_and_stops_them(
    tmp_path: Path, multi_user: bool
):
    run = ScriptRun(tmp_path, multi_user)
    try:
        run.wait_ready()
        flags = "-d -M" if multi_user else "-d"
        for uuid in CARDS:
            card = run.root / uuid
            assert (card / "pipe").is_dir() and (card / "log").is_dir()
            assert (card / "shm").stat().st_mode & 0o1777 == 0o1777
            assert f"nvidia-smi -i {uuid} -c EXCLUSIVE_PROCESS" in run.lines()
            assert f"mount --bind {card}/shm /dev/shm" in run.lines()
            assert f"daemon {flags} visible={uuid} pipe={card}/pipe log={card}/log" in run.lines()
            # What the plugin's Allocate mounts for a slice on this card is what was made.
            iso = Isolation(hook_host_path="", mps=True, mps_root=str(run.root))
            slice_ = Waiting("jhub/nb", "uid-nb", "notebook", uuid, 2, 2, 1)
            response = container_response(slice_, Card(0, uuid, "Tesla-T4", 15, 15360), 1024, iso)
            assert {m.host_path for m in response.mounts} == {f"{card}/pipe", f"{card}/shm"}
            assert all(Path(m.host_path).is_dir() for m in response.mounts)
        # One health check round (every MPS_CHECK_INTERVAL = 1 s): waited for, not slept through.
        checked = "control get_default_active_thread_percentage"
        assert wait_for(lambda: any(line.startswith(checked) for line in run.lines()), timeout=60, every=0.05)
        run.proc.send_signal(signal.SIGTERM)
        assert run.proc.wait(timeout=60) == 0
        for uuid in CARDS:
            assert f"control quit pipe={run.root}/{uuid}/pipe" in run.lines()
            assert f"nvidia-smi -i {uuid} -c DEFAULT" in run.lines()
        assert not run.ready.exists()
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


def test_a_daemon_that_stops_answering_fails_the_pod(tmp_path: Path):
    run = ScriptRun(tmp_path, multi_user=False)
    try:
        run.wait_ready()
        (run.root / CARDS[1] / "pipe" / "control").unlink()
        assert run.proc.wait(timeout=60) == 1
        assert "does not answer" in run.proc.communicate()[1]
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


def test_a_tmpfs_on_each_cards_shm_when_sized(tmp_path: Path):
    run = ScriptRun(tmp_path, multi_user=False, shm_size="8g")
    try:
        run.wait_ready()
        for uuid in CARDS:
            assert (
                f"mount -t tmpfs -o rw,nosuid,nodev,noexec,mode=1777,size=8g tmpfs {run.root}/{uuid}/shm"
                in run.lines()
            )
    finally:
        run.proc.kill()
        run.proc.wait()


def test_mps_on_needs_the_largest_slice_for_the_daemons_ceilings(helm: Helm):
    """Without mps.maxSliceMemory no daemon would have a ceiling, and any notebook could set
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 and take the card: the chart refuses, naming it."""
    proc = helm.run(
        "template", "x", str(CHART), f"--kube-version={KUBE_VERSION}",
        "--set", "mps.enabled=true", "--set", "mps.shmSize=1g", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "mps.maxSliceMemory" in proc.stderr and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in proc.stderr, (
        proc.stderr
    )


def test_the_largest_slice_is_each_daemons_memory_and_compute_ceiling(helm: Helm, tmp_path: Path):
    """mps.maxSliceMemory becomes each daemon's default pinned limit and its share of each card the
    default active thread percentage, both set before any client runs (a client cannot raise
    either above them: docs/measurements/2026-11-22-isolation-h100.md for memory,
    2026-11-28-mps-compute-share-h200.md for the share). The share is per card, rounded up as
    Allocate rounds: 7 GiB is 47% of a T4 (15360 MiB) and 32% of an A10 (23028 MiB)."""
    docs = helm.template(
        "--set", "mps.enabled=true", "--set", "mps.shmSize=1g", "--set", "mps.maxSliceMemory=7G"
    )
    assert {env_of(ds)["MPS_DEFAULT_PINNED_MEM_LIMIT"] for ds in daemonsets(docs).values()} == {"7G"}
    assert {env_of(ds)["MPS_DEFAULT_ACTIVE_THREAD_PERCENTAGE"] for ds in daemonsets(docs).values()} == {""}
    run = ScriptRun(
        tmp_path, multi_user=False, max_slice=env_of(daemonsets(docs)[SINGLE])["MPS_DEFAULT_PINNED_MEM_LIMIT"]
    )
    try:
        run.wait_ready()
        lines = run.lines()
        for uuid, share in zip(CARDS, (47, 32), strict=True):
            pipe = f"pipe={run.root}/{uuid}/pipe"
            started = lines.index(next(x for x in lines if x.startswith("daemon -d ") and pipe in x))
            limit = lines.index(f"control set_default_device_pinned_mem_limit 0 7G {pipe}")
            ceiling = lines.index(f"control set_default_active_thread_percentage {share} {pipe}")
            assert started < limit and started < ceiling
            # The ceiling is what Allocate gives the largest slice on that card, or just below it.
            card_units = {47: 15, 32: 22}[share]
            assert 0 <= computeshare.proportional(7, card_units) - share <= 1
    finally:
        run.proc.kill()
        run.proc.wait()


def test_an_explicit_compute_ceiling_wins(helm: Helm, tmp_path: Path):
    docs = helm.template(
        "--set", "mps.enabled=true", "--set", "mps.shmSize=1g", "--set", "mps.maxSliceMemory=7G",
        "--set", "mps.maxComputeShare=50",
    )  # fmt: skip
    assert {env_of(ds)["MPS_DEFAULT_ACTIVE_THREAD_PERCENTAGE"] for ds in daemonsets(docs).values()} == {"50"}
    run = ScriptRun(tmp_path, multi_user=True, max_slice="7G", max_share="50")
    try:
        run.wait_ready()
        for uuid in CARDS:
            assert (
                f"control set_default_active_thread_percentage 50 pipe={run.root}/{uuid}/pipe" in run.lines()
            )
    finally:
        run.proc.kill()
        run.proc.wait()
