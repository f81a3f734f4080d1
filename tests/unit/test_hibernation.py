"""Hibernation inside the notebook server (issue 46, part 1), on the fake GPU framework.

Each test runs a real Python process as a kernel's: the start-up hook and the fake torch on its
path, its container ledger, the simulated node's claims folder (what the device plugin measures on
the card). The notebook server's :class:`Hibernator` checkpoints it through the simulated driver,
as it would through libcuda, and the test reads the claims, the ledger and the process's output.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tornado import web

from gpushare_hub.isolation.checkpoint import CHECKPOINTED, RUNNING, CheckpointError
from gpushare_hub.isolation.simcheckpoint import SimulatedCheckpoint
from gpushare_hub.notebook.hibernator import Hibernator
from gpushare_hub.notebook.overslice import ledger_module
from gpushare_hub.notebook.sleepstate import AWAKE, HIBERNATED, REFUSED, WAITING, summary
from gpushare_hub.notebook.wakeonrun import action_of, hibernate_after
from tests.conftest import wait_for
from tests.support.isolation import hooked_env
from tests.support.pipes import readable

GIB = 1024**3

# A kernel: 3 GiB on the card, all 7s, and a variable; on a line, the GPU sum and the variable.
KERNEL = """
import sys, torch
x = torch.full({gib} * 1024**3, 7, dtype=torch.uint8, device="cuda")
before = "computed before hibernation"
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "free":
        del x
        torch.cuda.empty_cache()
        print("freed", flush=True)
    else:
        print(x.sum(), before, flush=True)
"""


class Kernels:
    """Jupyter Server's kernel manager, as the hibernator reads it."""

    def __init__(self) -> None:
        self.kernels: dict[str, Any] = {}

    def add(self, kid: str, pid: int, idle_s: float, state: str = "idle") -> Any:
        k = SimpleNamespace(
            provisioner=SimpleNamespace(pid=pid),
            execution_state=state,
            last_activity=datetime.now(UTC) - timedelta(seconds=idle_s),
        )
        self.kernels[kid] = k
        return k

    def list_kernel_ids(self) -> list[str]:
        return list(self.kernels)

    def get_kernel(self, kid: str) -> Any:
        return self.kernels[kid]


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Any]:
    claims, ledger = tmp_path / "claims", tmp_path / "ledger"
    claims.mkdir()
    env = hooked_env(tmp_path, ledger, GPUSHARE_CARD_UUIDS="GPU-hib", GPUSHARE_SIM_USAGE_DIR=str(claims))
    procs: list[subprocess.Popen[str]] = []

    def start(gib: int = 3, **extra: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", KERNEL.format(gib=gib)], env={**env, **extra}, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.append(proc)
        assert proc.stdout and proc.stdout.readline().strip() == "ready", proc.stderr and proc.stderr.read()
        assert wait_for(lambda: held(proc.pid) == gib * GIB, 30, every=0.1), "never in the ledger"
        return proc

    def held(pid: int) -> int | None:
        for p, h, _w in ledger_module().read_others(str(ledger), 0):
            if p == pid:
                return int(h)
        return None

    yield {"env": env, "claims": claims, "ledger": ledger, "start": start, "held": held}
    for proc in procs:
        proc.kill()
        proc.communicate(timeout=10)


def line(proc: subprocess.Popen[str], timeout: float) -> str | None:
    assert proc.stdout
    return proc.stdout.readline().strip() if readable(proc.stdout, timeout) else None


def claim_mib(claims: Path, pid: int) -> int:
    path = claims / f"{pid}.json"
    return int(json.loads(path.read_text())["mib"]) if path.exists() else 0


def test_an_idle_kernel_hibernates_the_card_gets_its_memory_back_and_a_cell_wakes_it_intact(node):
    proc = node["start"](3)
    kernels = Kernels()
    kernels.add("k1", proc.pid, idle_s=120)
    driver = SimulatedCheckpoint(str(node["claims"]))
    hib = Hibernator(kernels, driver, node["env"])
    assert claim_mib(node["claims"], proc.pid) == 3072

    asyncio.run(hib.tick(after_seconds=600))  # idle 2 min of 10: stays
    assert hib.sleep_of("k1").state == AWAKE and driver.state(proc.pid) == RUNNING
    asyncio.run(hib.tick(after_seconds=60))
    sleep = hib.sleep_of("k1")
    assert sleep.state == HIBERNATED and sleep.held == 3 * GIB, sleep
    assert driver.state(proc.pid) == CHECKPOINTED
    assert claim_mib(node["claims"], proc.pid) == 0  # the plugin measures the card free of it
    assert node["held"](proc.pid) == 0  # the container ledger counts it at 0
    assert summary([sleep]) == "1 kernel hibernated"

    # A cell that runs on the GPU waits (it does not fail) until the kernel is woken.
    assert proc.stdin
    proc.stdin.write("run\n")
    proc.stdin.flush()
    assert line(proc, 1.5) is None
    asyncio.run(hib.wake("k1"))
    assert hib.sleep_of("k1").state == AWAKE and driver.state(proc.pid) == RUNNING
    assert line(proc, 30) == f"{7 * 3 * GIB} computed before hibernation"
    assert claim_mib(node["claims"], proc.pid) == 3072
    assert wait_for(lambda: node["held"](proc.pid) == 3 * GIB, 10, every=0.1)


def test_a_wake_waits_for_room_inside_the_slice_and_says_who_holds_it(node):
    first = node["start"](3)
    kernels = Kernels()
    kernels.add("k1", first.pid, idle_s=120)
    hib = Hibernator(kernels, SimulatedCheckpoint(str(node["claims"])), node["env"])
    asyncio.run(hib.tick(after_seconds=60))
    assert hib.sleep_of("k1").state == HIBERNATED
    # With k1 asleep the slice's other process may take 4 of its 5 GiB.
    second = node["start"](4)

    async def wake_while_second_frees() -> list[str]:
        seen = []
        waking = asyncio.ensure_future(hib.wake("k1"))
        await asyncio.sleep(1.5)
        seen.append(hib.sleep_of("k1").state)
        seen.append(hib.sleep_of("k1").why)
        assert second.stdin
        second.stdin.write("free\n")
        second.stdin.flush()
        await asyncio.wait_for(waking, 60)
        return seen

    state, why = asyncio.run(wake_while_second_frees())
    assert state == WAITING
    words = "waiting for 3.0 GiB inside your 5.0 GiB slice: your other GPU processes hold 4.0 GiB"
    assert why.startswith(words), why
    assert hib.sleep_of("k1").state == AWAKE
    assert first.stdin
    first.stdin.write("run\n")
    first.stdin.flush()
    assert line(first, 30) == f"{7 * 3 * GIB} computed before hibernation"


def test_a_process_the_driver_refuses_stays_awake_and_says_why(node, tmp_path):
    pipe = tmp_path / "mps"
    pipe.mkdir()
    (pipe / "control").touch()  # a running MPS control daemon's pipe folder
    proc = node["start"](2, CUDA_MPS_PIPE_DIRECTORY=str(pipe), CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=5120M")
    kernels = Kernels()
    k = kernels.add("k1", proc.pid, idle_s=120)
    driver = SimulatedCheckpoint(str(node["claims"]))
    hib = Hibernator(kernels, driver, node["env"])
    asyncio.run(hib.tick(after_seconds=60))
    sleep = hib.sleep_of("k1")
    assert sleep.state == REFUSED
    assert "CUDA_ERROR_NOT_SUPPORTED" in sleep.why and "MPS client stays awake" in sleep.why, sleep.why
    assert driver.state(proc.pid) == RUNNING and claim_mib(node["claims"], proc.pid) == 2048
    # Not tried again for the same idle stretch; tried again after new work.
    calls = []

    def refuse(pid: int, timeout_ms: int = 0) -> None:
        calls.append(pid)
        raise CheckpointError("cuCheckpointProcessLock", 801)

    hib.driver = SimpleNamespace(lock=refuse)
    asyncio.run(hib.tick(after_seconds=60))
    assert calls == []
    k.last_activity = datetime.now(UTC) - timedelta(seconds=90)
    asyncio.run(hib.tick(after_seconds=60))
    assert calls == [proc.pid]


def test_busy_and_kept_awake_kernels_are_left_alone_and_a_busy_hibernated_one_wakes(node):
    proc = node["start"](1)
    kernels = Kernels()
    k = kernels.add("k1", proc.pid, idle_s=120, state="busy")
    hib = Hibernator(kernels, SimulatedCheckpoint(str(node["claims"])), node["env"])
    asyncio.run(hib.tick(after_seconds=60))
    assert hib.sleep_of("k1").state == AWAKE
    k.execution_state = "idle"
    hib.sleep_of("k1").keep_awake = True
    asyncio.run(hib.tick(after_seconds=60))
    assert hib.sleep_of("k1").state == AWAKE
    hib.sleep_of("k1").keep_awake = False
    asyncio.run(hib.tick(after_seconds=None))  # off for this server
    assert hib.sleep_of("k1").state == AWAKE
    asyncio.run(hib.tick(after_seconds=60))
    assert hib.sleep_of("k1").state == HIBERNATED

    async def turns_busy() -> None:  # a message from elsewhere than the websocket
        k.execution_state = "busy"
        await hib.tick(after_seconds=60)
        deadline = time.monotonic() + 30
        while hib.sleep_of("k1").state != AWAKE and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    asyncio.run(turns_busy())
    assert hib.sleep_of("k1").state == AWAKE


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"", 400, '"action" must be one of hibernate, wake, keep-awake, allow-sleep'),
        (b"{", 400, "the body is not JSON"),
        (b'{"action": "sleep"}', 400, "not 'sleep'"),
        (b"[1]", 400, '"action" must be one of'),
        (b"x" * 2000, 413, "send at most 1024"),
    ],
)
def test_the_api_refuses_a_bad_body_naming_it(body, status, words):
    with pytest.raises(web.HTTPError) as err:
        action_of(body)
    assert err.value.status_code == status and words in str(err.value.log_message)
    assert action_of(b'{"action": "keep-awake"}') == "keep-awake"


def test_the_hubs_hibernate_after_is_read_for_this_server_only():
    doc = {
        "allocations": [{"server": "", "hibernate_after": 600}, {"server": "gpu", "hibernate_after": None}]
    }
    assert hibernate_after(doc, {"JUPYTERHUB_SERVER_NAME": ""}) == 600
    assert hibernate_after(doc, {"JUPYTERHUB_SERVER_NAME": "gpu"}) is None
    assert hibernate_after({"allocations": [{"server": "", "hibernate_after": True}]}, {}) is None
    assert hibernate_after(None, {}) is None


def test_the_gpu_bench_runs_its_steps_on_the_simulated_driver_and_reports_the_data_intact(capsys):
    """``gpushare-bench hibernation`` is the script a lent GPU machine runs; ``--simulated`` runs
    its steps on the fake framework here (the figures mean nothing; the keys and the check do)."""
    import argparse

    from gpushare_hub.bench.hibernation import run

    args = argparse.Namespace(gib=0.25, frameworks="torch", mps_pipe="", simulated=True, json=True)
    assert run(args) == 0
    doc = json.loads(capsys.readouterr().out)
    (result,) = doc["results"]
    assert doc["simulated"] is True and "error" not in result, result
    assert result["state_checkpointed"] == CHECKPOINTED and result["intact"] is True
    for key in ("lock_s", "checkpoint_s", "restore_s", "unlock_s", "cell_wait_s", "restore_s_per_gib"):
        assert isinstance(result[key], float) and result[key] >= 0, (key, result)
    # The cell sent while checkpointed waited for the wake (the bench wakes it after 1 s).
    assert result["cell_wait_s"] < 60


def test_on_an_overcommitting_node_a_wake_waits_for_the_plugins_grant_and_idle_kernels_make_room(
    node, tmp_path
):
    """The door (issue 46, part 3): the server tells the plugin it is hibernated, a wake waits
    with the plugin's words until it is granted, and the plugin's hibernate_now hibernates the
    server's idle kernels even where the hub's rule is off."""
    door, answer = tmp_path / "door", tmp_path / "answer"
    door.mkdir()
    answer.mkdir()
    env = {**node["env"], "GPUSHARE_DOOR_DIR": str(door), "GPUSHARE_ANSWER_DIR": str(answer)}
    proc = node["start"](2)
    kernels = Kernels()
    kernels.add("k1", proc.pid, idle_s=120)
    hib = Hibernator(kernels, SimulatedCheckpoint(str(node["claims"])), env)

    def say(**doc: Any) -> None:
        (answer / "answer.json").write_text(json.dumps(doc))

    def asked() -> dict[str, Any]:
        return json.loads((door / "ask.json").read_text())

    asyncio.run(hib.tick(after_seconds=None))  # the hub's rule is off: nothing hibernates
    assert hib.sleep_of("k1").state == AWAKE
    assert asked() == {"hibernated": False, "wake": False, "idle_seconds": 120}
    say(state="awake", grant=False, hibernate_now=True, words="")  # a neighbour waits
    asyncio.run(hib.tick(after_seconds=None))
    assert hib.sleep_of("k1").state == HIBERNATED
    asyncio.run(hib.tick(after_seconds=None))
    assert asked()["hibernated"] is True

    words = "waiting for 2 GiB on your card: 1 ahead; neighbours idle 5 min are hibernated first"

    async def wake_when_granted() -> list[str]:
        waking = hib.wake_soon("k1")
        await asyncio.sleep(1.5)
        seen = [hib.sleep_of("k1").why]  # asked; the plugin's answer is older than the ask
        assert asked()["wake"] is True and not waking.done()
        time.sleep(0.05)  # the plugin answers the ask (a later file)
        say(state="hibernated", grant=False, place=2, ahead=1, words=words, hibernate_now=False)
        await asyncio.sleep(2.5)
        seen.append(hib.sleep_of("k1").why)
        assert not waking.done()
        say(state="hibernated", grant=True, words="", hibernate_now=False)
        await asyncio.wait_for(waking, 60)
        return seen

    stale = "waiting for the node's device plugin to answer this server's ask"
    assert asyncio.run(wake_when_granted()) == [stale, words]
    assert hib.sleep_of("k1").state == AWAKE
    assert claim_mib(node["claims"], proc.pid) == 2048
    # A bad answer file is no answer: a wake waits for the plugin, and nothing crashes.
    (answer / "answer.json").write_text("{not json")
    assert hib._not_granted().startswith("waiting for the node's device plugin to answer")


TAKER = """
import sys, torch
torch.cuda.init()
kept = []
print("ready", flush=True)
for line in sys.stdin:
    kept.append(torch.empty(int(line) * 1024**3, dtype=torch.uint8, device="cuda"))
    print("took", flush=True)
"""


def test_a_wake_counts_what_a_neighbour_took_just_before_it_even_if_not_yet_published(node):
    """The ledger's entries are up to half a second old: a kernel that took 4 GiB just before the
    wake's check must still keep the hibernated kernel's 3 GiB out of the 5 GiB slice."""
    sleeper = node["start"](3)
    kernels = Kernels()
    kernels.add("k1", sleeper.pid, idle_s=120)
    hib = Hibernator(kernels, SimulatedCheckpoint(str(node["claims"])), node["env"])
    asyncio.run(hib.tick(after_seconds=60))
    assert hib.sleep_of("k1").state == HIBERNATED
    taker = subprocess.Popen(
        [sys.executable, "-c", TAKER], env=node["env"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert line(taker, 30) == "ready"
        assert taker.stdin
        taker.stdin.write("4\n")
        taker.stdin.flush()
        assert line(taker, 30) == "took"

        async def wake_at_once() -> str:  # within the ledger's interval of the allocation
            waking = hib.wake_soon("k1")
            await asyncio.sleep(2.0)
            assert not waking.done(), "woke past the slice"
            waking.cancel()
            return hib.sleep_of("k1").why

        why = asyncio.run(wake_at_once())
        assert "your other GPU processes hold 4.0 GiB" in why, why
    finally:
        taker.kill()
        taker.communicate(timeout=10)
