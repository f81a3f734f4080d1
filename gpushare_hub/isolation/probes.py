"""The self-test's children: each a fresh Python of this environment (so the start-up hook applies)
that allocates through one framework until something stops it, and the check that the slice holds
for the whole server, two PyTorch processes in one container ledger (:func:`whole_server`)."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass

from gpushare_hub.core.names import LEDGER_DIR_ENV

CHILD_TIMEOUT_S = 300.0
MARKER = "GPUSHARE-SELFTEST "
MIB = 1 << 20

# The child: allocate ``step`` MiB at a time up to ``limit`` MiB, stop at the first
# out-of-memory error, print what it held (one JSON line after MARKER); with a fifth argument
# ``hold``, keep it until standard input closes.
CHILD = r"""
import json, sys
framework, limit, step, lift = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
MIB = 1 << 20
out = {"held_mib": 0, "stopped": False, "oom": None, "error": None}
held = []
try:
    if framework == "torch":
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False: this process sees no GPU")
        torch.cuda.init()  # runs what the start-up hook queued for CUDA's start
        if lift:
            torch.cuda.set_per_process_memory_fraction(1.0, 0)
        oom = getattr(torch.cuda, "OutOfMemoryError", RuntimeError)
        def take(mib):
            return torch.empty(mib * MIB, dtype=torch.uint8, device="cuda")
    elif framework == "cupy":
        import cupy
        if lift:
            cupy.get_default_memory_pool().set_limit(size=0)
        oom = cupy.cuda.memory.OutOfMemoryError
        def take(mib):
            return cupy.empty(mib * MIB, dtype=cupy.uint8)
    else:
        import jax.numpy as jnp
        oom = RuntimeError  # XlaRuntimeError, RESOURCE_EXHAUSTED
        def take(mib):
            return jnp.zeros((mib * MIB,), dtype=jnp.uint8).block_until_ready()
    while out["held_mib"] < limit:
        size = min(step, limit - out["held_mib"])
        try:
            held.append(take(size))
        except oom as err:
            if framework == "jax" and "RESOURCE_EXHAUSTED" not in str(err):
                raise
            out["stopped"] = True
            out["oom"] = (str(err).splitlines() or [type(err).__name__])[0][:300]
            break
        out["held_mib"] += size
except Exception as err:
    out["error"] = (type(err).__name__ + ": " + str(err)).splitlines()[0][:300]
print("GPUSHARE-SELFTEST " + json.dumps(out), flush=True)
if sys.argv[5:] == ["hold"]:  # keep what it took until the parent closes our stdin
    sys.stdin.readline()
"""


@dataclass(frozen=True)
class Probe:
    """One child's run: how much it held when it stopped (or reached its limit), or why it could not."""

    held_mib: int = 0
    stopped: bool = False
    oom: str | None = None
    error: str | None = None


def child_env(name: str, lift: bool, env: Mapping[str, str], ledger: str | None = None) -> dict[str, str]:
    """The child's environment: this one, less the framework's own cap when it is lifted (JAX and
    CuPy read theirs at start; PyTorch's is lifted by a call). ``ledger``: a container ledger of
    the child's own, so that what the server's kernels hold now does not move its cap."""
    out = dict(env)
    if ledger is not None and out.get(LEDGER_DIR_ENV):
        out[LEDGER_DIR_ENV] = ledger
    if lift and name == "cupy":
        out.pop("CUPY_GPU_MEMORY_LIMIT", None)
    if lift and name == "jax":
        out.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)
        out["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        out["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    return out


def probe(
    name: str, limit_mib: int, step_mib: int, lift: bool, env: Mapping[str, str], ledger: str | None = None
) -> Probe:
    """Run one child; what it reported, or why it did not. ``ledger``: the container ledger it
    shares (a new one of its own when None)."""
    argv = [sys.executable, "-c", CHILD, name, str(limit_mib), str(step_mib), "1" if lift else "0"]
    try:
        with tempfile.TemporaryDirectory(prefix="gpushare-selftest-") as own:
            proc = subprocess.run(
                argv, env=child_env(name, lift, env, ledger or own), capture_output=True, text=True,
                timeout=CHILD_TIMEOUT_S,
            )  # fmt: skip
    except subprocess.TimeoutExpired:
        return Probe(error=f"the {name} child did not finish in {CHILD_TIMEOUT_S:.0f} s")
    except OSError as err:
        return Probe(error=f"could not start {sys.executable}: {err}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                got = json.loads(line[len(MARKER) :])
                return Probe(int(got["held_mib"]), bool(got["stopped"]), got.get("oom"), got.get("error"))
            except (ValueError, KeyError, TypeError):
                break
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return Probe(error=f"the {name} child exited with code {proc.returncode}: {tail}")


@dataclass(frozen=True)
class WholeServer:
    """Two PyTorch processes of one server: the first holds ``first_mib``, then the second takes
    what it can. The slice holds for the whole server when the second stopped with the two
    together at or under the slice."""

    slice_mib: int
    first_mib: int
    second_stopped_at_mib: int | None  # None: nothing stopped the second run
    error: str | None = None

    @property
    def held(self) -> bool:
        return (
            self.error is None
            and self.second_stopped_at_mib is not None
            and self.first_mib + self.second_stopped_at_mib <= self.slice_mib
        )

    def words(self) -> str:
        if self.error is not None:
            return f"the whole server's slice could not be checked: {self.error}"
        second = self.second_stopped_at_mib
        if self.held:
            return (
                f"whole server: with {self.first_mib} MiB held by one PyTorch process, a second stopped at "
                f"{second} MiB: the slice holds for all of the server's processes together"
            )
        got = "got past the slice" if second is None else f"took {second} MiB"
        return (
            f"whole server: with {self.first_mib} MiB held by one PyTorch process, a second {got}: "
            "each process has the whole slice"
        )


def _marker(proc: subprocess.Popen[str], timeout: float) -> Probe:
    """The first child's report, read as it comes (the child then holds what it took)."""
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not selector.select(max(0.0, deadline - time.monotonic())):
            break
        line = proc.stdout.readline()
        if not line:
            return Probe(error=f"the first child exited with code {proc.wait(10)}")
        if line.startswith(MARKER):
            got = json.loads(line[len(MARKER) :])
            return Probe(int(got["held_mib"]), bool(got["stopped"]), got.get("oom"), got.get("error"))
    return Probe(error=f"the first child did not report in {timeout:.0f} s")


def _published(ledger: str, pid: int, mib: int, timeout: float = 10.0) -> bool:
    """Whether the ledger says ``pid`` holds at least ``mib`` MiB (it writes every half second)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(ledger, f"{pid}.json")) as f:
                if int(json.load(f).get("held", 0)) >= mib * MIB:
                    return True
        except (OSError, ValueError, AttributeError, TypeError):
            pass
        time.sleep(0.1)
    return False


def whole_server(
    slice_mib: int, step_mib: int, env: Mapping[str, str], beyond_mib: int
) -> WholeServer | None:
    """Two PyTorch children in one container ledger of their own; None where this container has
    no ledger (its caps are per process: nothing to check)."""
    if not env.get(LEDGER_DIR_ENV):
        return None
    first_mib = max(step_mib, slice_mib // 2 // step_mib * step_mib)
    with tempfile.TemporaryDirectory(prefix="gpushare-selftest-") as ledger:
        argv = [sys.executable, "-c", CHILD, "torch", str(first_mib), str(step_mib), "0", "hold"]
        first = subprocess.Popen(
            argv, env=child_env("torch", False, env, ledger), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        try:
            held = _marker(first, CHILD_TIMEOUT_S)
            error = held.error
            if error is None and held.held_mib < first_mib:
                error = f"the first process could take only {held.held_mib} MiB of {first_mib} MiB"
            if error is None and not _published(ledger, first.pid, first_mib):
                error = "the first process did not say in the container ledger what it holds"
            if error is not None:
                return WholeServer(slice_mib, held.held_mib, None, error)
            second = probe("torch", slice_mib + beyond_mib, step_mib, False, env, ledger)
            if second.error is not None:
                return WholeServer(slice_mib, first_mib, None, second.error)
            return WholeServer(slice_mib, first_mib, second.held_mib if second.stopped else None)
        finally:
            if first.stdin:
                first.stdin.close()
            try:
                first.wait(30)
            except subprocess.TimeoutExpired:
                first.kill()
                first.wait(10)
