"""``gpushare-bench hibernation``: on a real GPU, what hibernating a kernel costs (issue 46, part 5).

For each framework found (PyTorch, CuPy, JAX), a child Python process holds ``--gib`` GiB of
random bytes on the card and its checksum, as a notebook kernel would; this process, its
sibling, calls CUDA's process checkpoint API on it (:class:`~gpushare_hub.isolation.checkpoint.
LibCuda`, as the notebook server does) and prints:

* ``lock_s``, ``checkpoint_s``, ``restore_s``, ``unlock_s`` and seconds per GiB to checkpoint and
  to restore (the ratios: the size changes, the rate should not);
* ``card_used_mib`` before, while checkpointed and after (``nvidia-smi``), so that the memory
  shown to go back to the card is measured, not assumed;
* ``cell_wait_s``: a cell sent while the kernel is checkpointed (its GPU reduction blocks) and then
  woken at once: the time from the wake to its answer, which is what a user waits;
* ``intact``: the checksum after the wake equals the one before;
* ``refused``: with ``--mps-pipe DIR`` (a running MPS control daemon's pipe folder), the same as an
  MPS client: what the driver answers.

``--simulated`` runs the same steps on the fake GPU framework and the simulated driver (no card:
the figures mean nothing; it checks the script). ``--json`` prints one object; its keys are stable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from gpushare_hub.isolation.checkpoint import Checkpointer, CheckpointError, LibCuda

GIB = 1 << 30
# The kernel: holds n bytes of random values on the card; on each line of stdin, prints the
# checksum (a GPU reduction: it blocks while the process is checkpointed).
HOLD = {
    "torch": (
        "import torch\n"
        "n = {n}\n"
        "if hasattr(torch, 'randint'):\n"
        "    x = torch.randint(0, 255, (n,), dtype=torch.uint8, device='cuda')\n"
        "    check = lambda: int(x.sum(dtype=torch.int64))\n"
        "else:  # the fake torch\n"
        "    x = torch.full(n, 7, dtype=torch.uint8, device='cuda')\n"
        "    check = lambda: int(x.sum())\n"
    ),
    "cupy": (
        "import cupy\n"
        "x = cupy.random.randint(0, 255, {n}, dtype=cupy.uint8)\n"
        "check = lambda: int(x.sum(dtype=cupy.int64))\n"
    ),
    "jax": (
        "import jax, jax.numpy as jnp\n"
        "x = jax.random.randint(jax.random.PRNGKey(0), ({n},), 0, 255, dtype=jnp.uint8)\n"
        "check = lambda: int(jnp.sum(x, dtype=jnp.uint32))\n"
    ),
}
LOOP = "import sys\nprint(check(), flush=True)\nfor _ in sys.stdin:\n    print(check(), flush=True)\n"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("hibernation", help="on a real GPU: checkpoint and restore times, a woken cell's wait")
    p.add_argument("--gib", type=float, default=5.0, help="GiB each kernel holds (default 5)")
    p.add_argument("--frameworks", default="torch,cupy,jax", help="which to try, comma-separated")
    p.add_argument("--mps-pipe", default="", help="a running MPS control daemon's pipe folder: try a client")
    p.add_argument("--simulated", action="store_true", help="the fake GPU framework and driver (no card)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(run=run)


def card_used_mib() -> int | None:
    """The card's used memory by ``nvidia-smi`` (device 0), or None without one."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
        return int(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


class Kernel:
    """The child holding memory."""

    def __init__(self, framework: str, nbytes: int, env: dict[str, str]) -> None:
        code = HOLD[framework].format(n=nbytes) + LOOP
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.first = self.answer(600)

    def answer(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        poll = select.poll()  # not select(): it refuses descriptors from 1024 on
        poll.register(self.proc.stdout, select.POLLIN)
        ready = bool(poll.poll(timeout * 1000))
        line = self.proc.stdout.readline().strip() if ready else ""
        if line:
            return line
        if ready:  # the end of its output: it is exiting
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        if self.proc.poll() is not None:
            err = self.proc.stderr.read().strip().splitlines()[-1:] if self.proc.stderr else []
            raise RuntimeError(f"the kernel exited (code {self.proc.returncode}): {' '.join(err)[:300]}")
        raise RuntimeError(f"the kernel gave no answer in {timeout:.0f} s")

    def ask(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.communicate(timeout=30)


def timed(fn: Any, *args: Any) -> float:
    start = time.monotonic()
    fn(*args)
    return time.monotonic() - start


def measure(framework: str, gib: float, driver: Checkpointer, env: dict[str, str]) -> dict[str, Any]:
    """One framework's figures (``error`` in words where it could not be measured)."""
    out: dict[str, Any] = {"framework": framework, "gib": gib}
    try:
        kernel = Kernel(framework, int(gib * GIB), env)
    except (RuntimeError, OSError) as err:
        return {**out, "error": f"could not hold {gib} GiB: {err}"}
    try:
        pid = kernel.proc.pid
        out["card_used_mib_awake"] = card_used_mib()
        out["lock_s"] = timed(driver.lock, pid)
        out["checkpoint_s"] = timed(driver.checkpoint, pid)
        out["state_checkpointed"] = driver.state(pid)
        out["card_used_mib_hibernated"] = card_used_mib()
        kernel.ask()  # a cell while checkpointed: its reduction blocks
        time.sleep(1.0)
        woke = time.monotonic()
        out["restore_s"] = timed(driver.restore, pid)
        out["unlock_s"] = timed(driver.unlock, pid)
        answer = kernel.answer(600)
        out["cell_wait_s"] = time.monotonic() - woke
        out["card_used_mib_woken"] = card_used_mib()
        out["intact"] = answer == kernel.first
        out["checkpoint_s_per_gib"] = out["checkpoint_s"] / gib
        out["restore_s_per_gib"] = out["restore_s"] / gib
    except (CheckpointError, RuntimeError) as err:
        out["error"] = str(err)
    finally:
        kernel.stop()
    return out


def refused_as_mps_client(gib: float, driver: Checkpointer, env: dict[str, str], pipe: str) -> dict[str, Any]:
    """What the driver answers when asked to lock an MPS client."""
    limit = f"0={int(gib * 1024) + 1024}M"
    mps_env = {**env, "CUDA_MPS_PIPE_DIRECTORY": pipe, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": limit}
    try:
        kernel = Kernel("torch", int(gib * GIB), mps_env)
    except (RuntimeError, OSError) as err:
        return {"error": f"no MPS client could start: {err}"}
    try:
        driver.lock(kernel.proc.pid)
        driver.checkpoint(kernel.proc.pid)
        driver.restore(kernel.proc.pid)
        driver.unlock(kernel.proc.pid)
        kernel.ask()
        return {"refused": False, "intact": kernel.answer(60) == kernel.first}
    except CheckpointError as err:
        return {"refused": True, "error": str(err)}
    finally:
        kernel.stop()


def run(args: argparse.Namespace) -> int:
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    driver: Checkpointer = LibCuda()
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = [f for f in frameworks if f not in HOLD]
    if unknown or args.gib <= 0:
        known = ", ".join(HOLD)
        print(f"gpushare-bench hibernation: --frameworks takes {known}; --gib above 0", file=sys.stderr)
        return 2
    scratch = None
    if args.simulated:
        from gpushare_hub.demo.fakegpu import site_dir
        from gpushare_hub.isolation.simcheckpoint import SimulatedCheckpoint

        scratch = tempfile.mkdtemp(prefix="gpushare-hibernation-")
        env.update(PYTHONPATH=str(site_dir()), GPUSHARE_SIM_USAGE_DIR=scratch, GPUSHARE_CARD_UUIDS="GPU-sim")
        driver, frameworks = SimulatedCheckpoint(scratch), ["torch"]
    try:
        results = [measure(f, args.gib, driver, env) for f in frameworks]
        doc: dict[str, Any] = {"simulated": args.simulated, "results": results}
        if args.mps_pipe:
            doc["mps_client"] = refused_as_mps_client(args.gib, driver, env, args.mps_pipe)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(render(doc))
    return 0


def render(doc: dict[str, Any]) -> str:
    simulated = "hibernation (simulated: no card, the figures check the script only)"
    lines = [simulated if doc["simulated"] else "hibernation"]
    for r in doc["results"]:
        if "error" in r:
            lines.append(f"  {r['framework']:<6} {r['gib']:g} GiB: {r['error']}")
            continue
        lines.append(
            f"  {r['framework']:<6} {r['gib']:g} GiB: checkpoint {r['checkpoint_s']:.2f} s "
            f"({r['checkpoint_s_per_gib']:.2f} s/GiB), restore {r['restore_s']:.2f} s "
            f"({r['restore_s_per_gib']:.2f} s/GiB), a woken cell waited {r['cell_wait_s']:.2f} s, "
            f"data {'intact' if r['intact'] else 'CHANGED'}; card used MiB awake/hibernated/woken "
            f"{r['card_used_mib_awake']}/{r['card_used_mib_hibernated']}/{r['card_used_mib_woken']}"
        )
    if "mps_client" in doc:
        lines.append(f"  MPS client: {json.dumps(doc['mps_client'])}")
    return "\n".join(lines)
