"""The container ledger (issues 37 and 47): one slice for every Python process of a notebook server,
whatever framework holds the memory, and however close together the processes start.

Each test runs real Python processes with the start-up hook and the fake torch (and the fake CuPy
and JAX of tests/support) on their path, as the device plugin's Allocate starts them (its
environment, the ledger folder standing in for the container's own /tmp), and reads what the
fakes and the ledger's files say.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import gpushare_hub
from gpushare_hub.isolation.hookfiles import HOOK_DIR
from tests.conftest import wait_for
from tests.support.isolation import FAKE_FRAMEWORKS, hooked_env

GIB = 1024**3
SLICE = {"GPUSHARE_MEMORY_LIMIT_MIB": "5120", "GPUSHARE_CARD_MEMORY_MIB": "15360"}

# Holds GIB_A GiB, says so, and keeps it until its standard input closes.
HOLDER = """
import sys, torch
held = torch.empty({gib} * 1024**3, dtype=torch.uint8, device="cuda")
print("held", flush=True)
sys.stdin.readline()
"""

# Asks 3 GiB (past what the holder left), then 1.5 GiB; waits for a line; then asks 3 GiB more.
SECOND = """
import sys, time, torch, sitecustomize
kept = []
def take(gib):
    try:
        kept.append(torch.empty(int(gib * 1024**3), dtype=torch.uint8, device="cuda"))
        print("took", gib, flush=True)
    except torch.cuda.OutOfMemoryError as err:
        note = sitecustomize.explain_oom(err, me="not asked in this test")
        print("refused", gib, json.dumps(note), flush=True)
import json
take(3)
take(1.5)
sys.stdin.readline()
time.sleep(1.5)
take(3)
"""


def env_for(tmp_path: Path, ledger: Path) -> dict[str, str]:
    return hooked_env(tmp_path, ledger)


def start(code: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def stop(proc: subprocess.Popen[str]) -> None:
    """Let it end (its standard input closed), killing it only if it does not in 10 s; reap it
    and close its pipes."""
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=10)


def entries(ledger: Path) -> dict[int, dict[str, object]]:
    out = {}
    for path in ledger.glob("*.json"):
        try:
            out[int(path.stem)] = json.loads(path.read_text())
        except (ValueError, OSError):
            continue
    return out


def test_the_second_process_gets_what_the_first_left_and_a_killed_ones_share_comes_back(tmp_path):
    ledger = tmp_path / "tmp" / "gpushare-hub-ledger"
    env = env_for(tmp_path, ledger)
    first = start(HOLDER.format(gib=3), env)
    second = None
    try:
        assert first.stdout and first.stdout.readline().strip() == "held", first.stderr
        # It says what it holds within the ledger's interval.
        assert wait_for(lambda: entries(ledger).get(first.pid, {}).get("held") == 3 * GIB, 10, every=0.1)
        second = start(SECOND, env)
        assert second.stdout
        refused = second.stdout.readline().split(" ", 2)
        assert refused[:2] == ["refused", "3"], (refused, second.stderr.read() if second.stderr else "")
        note = json.loads(refused[2])
        assert "other GPU processes hold 3 GiB of the slice: python (pid " in note, note
        assert "would take this server past its slice" in note, note
        assert second.stdout.readline().split() == ["took", "1.5"]
        # Together they hold 4.5 GiB of the 5 GiB slice: never more.
        assert wait_for(
            lambda: entries(ledger).get(second.pid, {}).get("held") == int(1.5 * GIB), 10, every=0.1
        )
        assert sum(int(e["held"]) for e in entries(ledger).values()) <= 5 * GIB  # type: ignore[call-overload]

        first.kill()  # a kernel killed, not shut down: nothing of it runs to clean up
        first.wait(10)
        assert first.pid in entries(ledger)  # its file stays ...
        second.stdin.write("go\n")  # type: ignore[union-attr]
        second.stdin.flush()  # type: ignore[union-attr]
        assert second.stdout.readline().split() == ["took", "3"]  # ... but its share came back
        assert first.pid not in entries(ledger)  # and the stale file went
    finally:
        for proc in (first, second):
            if proc is not None:
                stop(proc)
    assert entries(ledger) == {}, "each process took its entry with it at exit"


CORRUPT = [
    b"not json",
    b"\xff\xfe",
    b"[1, 2]",
    b'{"pid": "PID", "start": "1", "held": 1, "what": "x"}',
    b'{"pid": PID, "start": "1", "held": -5, "what": "x"}',
    b'{"pid": PID, "start": "1", "held": true, "what": "x"}',
    b'{"pid": PID, "start": 7, "held": 1, "what": "x"}',
    b'{"pid": 1, "start": "1", "held": 1, "what": "x"}',  # another process's pid
    b"[" * 4000,
    b'{"pid": PID, "start": "1", "held": 1, "what": "' + b"x" * 5000 + b'"}',
]


def test_a_corrupt_ledger_crashes_nothing_and_takes_nothing(tmp_path):
    """Files the user's own code wrote (or a crash left) never stop a kernel, nor lower its cap."""
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    for i, content in enumerate(CORRUPT):
        pid = 4_000_000 + i  # past any pid_max: only the content decides
        (ledger / f"{pid}.json").write_bytes(content.replace(b"PID", str(pid).encode()))
    (ledger / "1.json").symlink_to("/proc/self/environ")  # never followed
    (ledger / "x.json").write_text("{}")
    (ledger / "-3.json").write_text("{}")
    (ledger / "².json").write_text("{}")  # a Unicode digit: int() would refuse it
    proc = subprocess.run(
        [sys.executable, "-c", SECOND.replace("sys.stdin.readline()", "")],
        env=env_for(tmp_path, ledger), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:3] == [
        "took 3",
        "took 1.5",
        "refused 3 " + proc.stdout.split("\n")[2][10:],
    ]
    assert proc.stderr == ""


def test_a_stale_entry_of_an_ended_process_is_removed_and_counts_for_nothing(tmp_path):
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    ended = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    gone = int(ended.stdout)
    (ledger / f"{gone}.json").write_text(
        json.dumps({"pid": gone, "start": "1", "held": 5 * GIB, "what": "x"})
    )
    proc = subprocess.run(
        [sys.executable, "-c", SECOND.replace("sys.stdin.readline()", "")],
        env=env_for(tmp_path, ledger), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.stdout.split("\n")[:2] == ["took 3", "took 1.5"], proc.stdout + proc.stderr
    assert not (ledger / f"{gone}.json").exists()


def test_without_a_ledger_folder_each_process_keeps_its_own_cap(tmp_path):
    """Outside a container that Allocate named a ledger for, the hook is per process, as before."""
    env = env_for(tmp_path, tmp_path / "unused")
    del env["GPUSHARE_LEDGER_DIR"]
    first = start(HOLDER.format(gib=3), env)
    try:
        assert first.stdout and first.stdout.readline().strip() == "held"
        time.sleep(1)
        proc = subprocess.run(
            [sys.executable, "-c", SECOND.replace("sys.stdin.readline()", "")],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.stdout.split("\n")[0] == "took 3", proc.stdout + proc.stderr
    finally:
        stop(first)
    assert not (tmp_path / "unused").exists()


def test_a_killed_process_not_yet_reaped_counts_as_ended():
    """A killed kernel is a zombie until Jupyter Server reaps it: its share is back already."""
    sys.path.insert(0, str(HOOK_DIR))
    try:
        import _gpushare_hub_ledger as ledger
    finally:
        sys.path.remove(str(HOOK_DIR))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert ledger.start_time(child.pid) is not None
        child.kill()
        assert wait_for(lambda: ledger.start_time(child.pid) is None, 10, every=0.05)
        assert child.returncode is None  # not reaped yet: a zombie
    finally:
        child.kill()
        child.wait(10)
    assert ledger.start_time(os.getpid()) is not None


def test_cupy_and_jax_start_with_what_the_slice_has_left(tmp_path):
    """They read their caps from the environment when they start; nothing can set them again."""
    ledger = tmp_path / "tmp" / "gpushare-hub-ledger"
    env = env_for(tmp_path, ledger)
    env["CUPY_GPU_MEMORY_LIMIT"] = str(5 * GIB)  # Allocate's, the whole slice
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.333"
    fakes = tmp_path / "fakes"
    for name, var in (("cupy", "CUPY_GPU_MEMORY_LIMIT"), ("jax", "XLA_PYTHON_CLIENT_MEM_FRACTION")):
        (fakes / name).mkdir(parents=True)
        (fakes / name / "__init__.py").write_text(f"import os\nprint({name!r}, os.environ[{var!r}])\n")
    env["PYTHONPATH"] += os.pathsep + str(fakes)
    alone = subprocess.run(
        [sys.executable, "-c", "import cupy, jax"], env=env, capture_output=True, text=True
    )
    assert alone.stdout.split("\n")[:2] == [f"cupy {5 * GIB}", "jax 0.333"], alone.stdout + alone.stderr
    holder = start(HOLDER.format(gib=3), env)
    try:
        assert holder.stdout and holder.stdout.readline().strip() == "held"
        assert wait_for(lambda: entries(ledger).get(holder.pid, {}).get("held") == 3 * GIB, 10, every=0.1)
        beside = subprocess.run(
            [sys.executable, "-c", "import cupy, jax"], env=env, capture_output=True, text=True
        )
        assert beside.stdout.split("\n")[:2] == [f"cupy {2 * GIB}", f"jax {2048 / 15360:.4f}"], beside.stdout
    finally:
        stop(holder)


def hook_ledger() -> Any:
    """The hook's _gpushare_hub_ledger.py, loaded as the hook loads it (no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_gpushare_hub_ledger", Path(HOOK_DIR) / "_gpushare_hub_ledger.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_symlink_planted_in_the_ledger_folder_is_not_followed(tmp_path, monkeypatch):
    """Another user of the container plants links where the entry's temporary file goes: the
    entry is written exclusively, and the link's target is untouched."""
    hook = hook_ledger()
    folder, target = tmp_path / "ledger", tmp_path / "precious"
    folder.mkdir()
    target.write_text("precious")
    pid = os.getpid()
    (folder / f".{pid}.tmp").symlink_to(target)  # the name the entry's temporary file had
    ledger = hook.Ledger(5 * GIB, env={hook.LEDGER_VAR: str(folder)})
    ledger.publish(3 * GIB)
    assert target.read_text() == "precious"
    entry = folder / f"{pid}.json"
    assert not entry.is_symlink() and json.loads(entry.read_text())["held"] == 3 * GIB
    assert entry.stat().st_mode & 0o022 == 0  # nobody else may write it
    # A link at the very name it draws: the exclusive create refuses it, nothing is followed.
    monkeypatch.setattr(hook, "_tmp_name", lambda pid: f".{pid}.planted.tmp")
    (folder / f".{pid}.planted.tmp").symlink_to(target)
    ledger.publish(4 * GIB)
    assert target.read_text() == "precious"
    assert json.loads(entry.read_text())["held"] == 3 * GIB  # the old entry stays


# ---- every framework counts (issue 47) --------------------------------------------------------
# Allocate's caps for CuPy and JAX: the whole 5 GiB slice of the 15 GiB card.
FRAMEWORK_CAPS = {
    "CUPY_GPU_MEMORY_LIMIT": str(5 * GIB),
    "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3333",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
}

# Takes each GiB amount of its arguments in turn through PyTorch, saying what happened.
TAKE = """
import json, sys, sitecustomize, torch
kept = []
for gib in map(float, sys.argv[1:]):
    try:
        kept.append(torch.empty(int(gib * 1024**3), dtype=torch.uint8, device="cuda"))
        print("took", gib, flush=True)
    except torch.cuda.OutOfMemoryError as err:
        print("refused", gib, json.dumps(sitecustomize.explain_oom(err, me="not asked")), flush=True)
"""

# Holds GiB through CuPy or JAX (CuPy also pinned host memory, which never counts), says so, and
# keeps it until its standard input closes.
HOLDERS = {
    "cupy": """
import sys, cupy
held = cupy.empty({gib} * 1024**3, dtype=cupy.uint8)
pinned = cupy.cuda.alloc_pinned_memory(1024**3)
print("held", flush=True)
sys.stdin.readline()
""",
    "jax": """
import sys, jax.numpy as jnp
held = jnp.zeros({gib} * 1024**3, dtype=jnp.uint8)
print("held", flush=True)
sys.stdin.readline()
""",
}

# Takes 3 GiB through CuPy or JAX, saying what happened (with the note, for CuPy's error).
TAKE_3 = {
    "cupy": """
import json, sitecustomize, cupy
try:
    held = cupy.empty(3 * 1024**3, dtype=cupy.uint8)
    print("took 3", flush=True)
except cupy.cuda.memory.OutOfMemoryError as err:
    print("refused 3", json.dumps(sitecustomize.explain_oom(err, "cupy", me="not asked")), flush=True)
""",
    "jax": """
import jax, jax.numpy as jnp
try:
    held = jnp.zeros(3 * 1024**3, dtype=jnp.uint8)
    print("took 3", flush=True)
except jax.errors.JaxRuntimeError as err:
    print("refused 3", str(err).split(":")[0], flush=True)
""",
}


def framework_env(tmp_path: Path, ledger: Path) -> dict[str, str]:
    env = {**env_for(tmp_path, ledger), **FRAMEWORK_CAPS}
    env["PYTHONPATH"] += os.pathsep + str(FAKE_FRAMEWORKS)
    return env


def run(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("framework", ["cupy", "jax"])
def test_what_cupy_and_jax_hold_counts_and_a_pytorch_neighbour_is_refused_past_the_slice(tmp_path, framework):
    ledger = tmp_path / "ledger"
    env = framework_env(tmp_path, ledger)
    holder = start(HOLDERS[framework].format(gib=3), env)
    try:
        assert holder.stdout and holder.stdout.readline().strip() == "held", holder.stderr
        # What its allocator holds on the card; CuPy's pinned pool is host memory.
        assert wait_for(lambda: entries(ledger).get(holder.pid, {}).get("held") == 3 * GIB, 10, every=0.05)
        neighbour = run(TAKE, env, "3", "1.5")
        refused, took = neighbour.stdout.split("\n")[:2]
        assert refused.startswith("refused 3.0 "), neighbour.stdout + neighbour.stderr
        note = json.loads(refused[len("refused 3.0 ") :])
        assert f"other GPU processes hold 3 GiB of the slice: python (pid {holder.pid})" in note, note
        assert took == "took 1.5"
    finally:
        stop(holder)
    assert entries(ledger) == {}, "the holder took its entry with it at exit"


def test_cupy_started_before_a_pytorch_neighbour_filled_the_slice_gets_its_pool_limit_lowered(tmp_path):
    """CuPy reads its cap once; the hook sets the pool's limit again whenever the cap changes."""
    ledger, log = tmp_path / "ledger", tmp_path / "events"
    env = {**framework_env(tmp_path, ledger), "FAKE_LOG": str(log)}
    cupy = start(
        """
import sys, cupy
pool = cupy.get_default_memory_pool()
print(pool.get_limit(), flush=True)
kept = [cupy.empty(512 * 1024**2, dtype=cupy.uint8)]
print(pool.get_limit(), flush=True)
for line in sys.stdin:
    gib = float(line)
    try:
        kept.append(cupy.empty(int(gib * 1024**3), dtype=cupy.uint8)) if gib else None
        print("took" if gib else "limit", pool.get_limit(), flush=True)
    except cupy.cuda.memory.OutOfMemoryError:
        print("refused", pool.get_limit(), flush=True)
""",
        env,
    )
    holder = None
    try:
        assert cupy.stdout and cupy.stdout.readline().strip() == str(5 * GIB), cupy.stderr
        assert cupy.stdout.readline().strip() == str(5 * GIB)  # alone: the whole slice
        assert wait_for(lambda: entries(ledger).get(cupy.pid, {}).get("held") == GIB // 2, 10, every=0.05)
        holder = start(HOLDER.format(gib=4), env)  # 4 GiB of the 4.5 GiB CuPy left
        assert holder.stdout and holder.stdout.readline().strip() == "held", holder.stderr

        def limit() -> str:
            cupy.stdin.write("0\n")  # type: ignore[union-attr]
            cupy.stdin.flush()  # type: ignore[union-attr]
            return cupy.stdout.readline().strip()  # type: ignore[union-attr]

        assert wait_for(lambda: limit() == f"limit {GIB}", 10, every=0.05)  # 5 GiB less the 4 held
        cupy.stdin.write("1\n0.25\n")  # type: ignore[union-attr]
        cupy.stdin.flush()  # type: ignore[union-attr]
        assert cupy.stdout.readline().split() == ["refused", str(GIB)]  # 0.5 + 1 GiB: past it
        assert cupy.stdout.readline().split() == ["took", str(GIB)]
    finally:
        for proc in (cupy, holder):
            if proc is not None:
                stop(proc)
    # The hook never started CUDA before CuPy did (a fork after `import cupy` stays safe).
    events = [json.loads(line)[0] for line in log.read_text().splitlines()]
    assert events[:2] == ["cupy-import", "cuda-init"], events


@pytest.mark.parametrize("framework", ["cupy", "jax"])
def test_cupy_and_jax_started_right_after_a_pytorch_neighbour_allocated_count_it(tmp_path, framework):
    """The neighbour allocated a moment ago, well within the ledger's interval: it is asked to
    publish before the new process takes its cap."""
    ledger = tmp_path / "ledger"
    env = framework_env(tmp_path, ledger)
    holder = start(HOLDER.format(gib=3), env)
    try:
        assert holder.stdout and holder.stdout.readline().strip() == "held", holder.stderr
        late = run(TAKE_3[framework], env)  # no pause
        assert late.stdout.startswith("refused 3 "), late.stdout + late.stderr
        if framework == "cupy":
            note = json.loads(late.stdout[len("refused 3 ") :])
            assert f"other GPU processes hold 3 GiB of the slice: python (pid {holder.pid})" in note, note
        else:
            assert late.stdout.split() == ["refused", "3", "RESOURCE_EXHAUSTED"]
    finally:
        stop(holder)


def test_two_processes_started_back_to_back_cannot_pass_the_slice_together(tmp_path):
    """`python -m gpushare_hub.demo.fakealloc 3`, twice, with no pause: one of them is refused."""
    env = env_for(tmp_path, tmp_path / "ledger")
    env["PYTHONPATH"] += os.pathsep + str(Path(gpushare_hub.__file__).parents[1])
    argv = [sys.executable, "-m", "gpushare_hub.demo.fakealloc", "3", "--seconds", "60"]
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        firsts = [proc.stdout.readline() if proc.stdout else "" for proc in procs]  # "" once it exited
        held = [proc for proc, line in zip(procs, firsts, strict=True) if line.startswith("holding 3 GiB")]
        refused = [proc for proc, line in zip(procs, firsts, strict=True) if not line]
        assert len(held) == 1 and len(refused) == 1, firsts
        assert refused[0].wait(30) == 1
        assert "torch.OutOfMemoryError: CUDA out of memory" in (
            refused[0].stderr.read() if refused[0].stderr else ""
        )
    finally:
        for proc in procs:
            proc.terminate()
            proc.communicate(timeout=30)


def test_a_start_lock_held_elsewhere_and_an_entry_that_never_answers_delay_a_start_never_stop_it(tmp_path):
    """Every wait of a start is bounded: a lock someone keeps, a process that never publishes."""
    hook = hook_ledger()
    ledger = tmp_path / "ledger"
    ledger.mkdir()
    me = os.getpid()  # a live process whose entry says 1 GiB and answers no request
    silent = {"pid": me, "start": hook.start_time(me), "held": GIB, "what": "stopped (pid 1)", "sync": 1}
    (ledger / f"{me}.json").write_text(json.dumps(silent))
    with open(ledger / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        began = time.monotonic()
        proc = run(TAKE, {**env_for(tmp_path, ledger), "GPUSHARE_HOOK_DEBUG": "1"}, "4", "0.5")
        waited = time.monotonic() - began
    assert proc.stdout.split("\n")[0] == "took 4.0", proc.stdout + proc.stderr  # 5 GiB less its 1
    assert proc.stdout.split("\n")[1].startswith("refused 0.5 ")
    assert "start.lock is held past 2.0 s: starting without it" in proc.stderr
    assert f"no answer from [{me}] in 1.0 s" in proc.stderr
    assert waited < 30
