"""CUDA's process checkpoint calls on the fake GPU framework's processes (the demo, the tests).

The fake ``torch`` (gpushare_hub/demo/fakegpu) keeps what a process holds on its card as a claim,
``<dir>/<pid>.json`` in ``$GPUSHARE_SIM_USAGE_DIR``, which the simulated device plugin reports as
that process's memory on the card. Here the same folder holds, per process:

* ``<pid>.checkpoint``: its state while not running, ``{"state": 1|2|3, "claim": {...}}``
  (absent: running);
* ``<pid>.gate``: a file the fake torch holds an exclusive ``flock`` on for each GPU operation
  (an allocation, a synchronize, a reduction); it runs one only while the process is running.

So the calls mean what the driver's do: :meth:`lock` waits (up to its timeout) for the operation
in flight and stops new ones, which then block, as a locked process's CUDA calls do;
:meth:`checkpoint` takes the claim away (the card's memory is free: the plugin measures the
process gone) and keeps it in the state; :meth:`restore` puts it back if the card has the room,
else answers ``CUDA_ERROR_OUT_OF_MEMORY``; :meth:`unlock` lets the process run again. A process
whose environment names an MPS pipe folder with a running control daemon is refused
(``CUDA_ERROR_NOT_SUPPORTED``): what the real driver does with MPS clients is not measured yet, and
gpushare-hub keeps them awake.

The copies take no time unless the folder's ``rates.json`` says how long the simulated card takes
per GiB (``{"checkpoint_s_per_gib": 0.64, "restore_s_per_gib": 0.2}`` is what an H200 took), so
that the demo and the tests can show a kernel waking.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from typing import Any

from .checkpoint import (
    CHECKPOINTED,
    ILLEGAL_STATE,
    INVALID_VALUE,
    LOCK_TIMEOUT_MS,
    LOCKED,
    NOT_SUPPORTED,
    OUT_OF_MEMORY,
    RUNNING,
    TIMEOUT,
    CheckpointError,
)

MIB = 1 << 20
DEFAULT_CARD_MIB = 15360
MAX_CLAIM_BYTES = 4096


class SimulatedCheckpoint:
    """The five calls on the processes whose claims are in ``folder``."""

    def __init__(self, folder: str, proc: str = "/proc") -> None:
        self.folder = folder
        self.proc = proc

    # ---- files ----------------------------------------------------------------------------
    def _path(self, pid: int, ext: str) -> str:
        return os.path.join(self.folder, f"{int(pid)}.{ext}")

    def _read(self, path: str) -> dict[str, Any] | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                raw = f.read(MAX_CLAIM_BYTES + 1)
            doc = json.loads(raw) if len(raw) <= MAX_CLAIM_BYTES else None
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def _write(self, path: str, doc: dict[str, Any]) -> None:
        tmp = f"{path}.{os.urandom(6).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)

    def _environ(self, pid: int) -> dict[str, str]:
        try:
            with open(f"{self.proc}/{int(pid)}/environ", "rb") as f:
                raw = f.read(1 << 20)
        except OSError:
            return {}
        out = {}
        for item in raw.split(b"\0"):
            key, sep, value = item.partition(b"=")
            if sep:
                out[key.decode(errors="replace")] = value.decode(errors="replace")
        return out

    def _alive(self, pid: int, call: str) -> None:
        if pid <= 0 or not os.path.exists(f"{self.proc}/{int(pid)}"):
            raise CheckpointError(call, INVALID_VALUE, f"no process {pid}")

    def _expect(self, pid: int, call: str, want: int) -> dict[str, Any]:
        self._alive(pid, call)
        doc = self._read(self._path(pid, "checkpoint")) or {"state": RUNNING}
        if doc.get("state") != want:
            raise CheckpointError(call, ILLEGAL_STATE, f"process {pid} is {doc.get('state')}, not {want}")
        return doc

    # ---- the calls ------------------------------------------------------------------------
    def state(self, pid: int) -> int:
        self._alive(pid, "cuCheckpointProcessGetState")
        doc = self._read(self._path(pid, "checkpoint")) or {}
        value = doc.get("state", RUNNING)
        return value if isinstance(value, int) else RUNNING

    def lock(self, pid: int, timeout_ms: int = LOCK_TIMEOUT_MS) -> None:
        call = "cuCheckpointProcessLock"
        self._expect(pid, call, RUNNING)
        env = self._environ(pid)
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
        if env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") and os.path.exists(os.path.join(pipe, "control")):
            raise CheckpointError(call, NOT_SUPPORTED, "an MPS client")
        fd = os.open(self._path(pid, "gate"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            deadline = time.monotonic() + timeout_ms / 1000 if timeout_ms else None
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise CheckpointError(call, TIMEOUT, f"process {pid} kept the GPU busy") from None
                    time.sleep(0.02)
            self._write(self._path(pid, "checkpoint"), {"state": LOCKED, "claim": None})
        finally:
            os.close(fd)  # closing drops the flock

    def _copy(self, claim: dict[str, Any] | None, rate: str) -> None:
        """Take the time the card takes to copy the claim's memory (``rates.json``; none)."""
        rates = self._read(os.path.join(self.folder, "rates.json")) or {}
        per_gib = rates.get(rate)
        if isinstance(per_gib, int | float) and not isinstance(per_gib, bool) and 0 < per_gib <= 30:
            time.sleep(per_gib * _mib((claim or {}).get("mib")) / 1024)

    def checkpoint(self, pid: int) -> None:
        self._expect(pid, "cuCheckpointProcessCheckpoint", LOCKED)
        claim_path = self._path(pid, "json")
        claim = self._read(claim_path)
        self._copy(claim, "checkpoint_s_per_gib")
        self._write(self._path(pid, "checkpoint"), {"state": CHECKPOINTED, "claim": claim})
        with contextlib.suppress(FileNotFoundError):
            os.unlink(claim_path)

    def restore(self, pid: int) -> None:
        call = "cuCheckpointProcessRestore"
        doc = self._expect(pid, call, CHECKPOINTED)
        claim = doc.get("claim")
        if isinstance(claim, dict):
            need = _mib(claim.get("mib")) * MIB
            free = self._card_bytes(pid) - self._others(pid, str(claim.get("card", "")))
            if need > free:
                words = f"{need // MIB} MiB to restore, {max(0, free) // MIB} MiB free on the card"
                raise CheckpointError(call, OUT_OF_MEMORY, words)
            self._copy(claim, "restore_s_per_gib")
            self._write(self._path(pid, "json"), claim)
        self._write(self._path(pid, "checkpoint"), {"state": LOCKED, "claim": None})

    def unlock(self, pid: int) -> None:
        self._expect(pid, "cuCheckpointProcessUnlock", LOCKED)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(pid, "checkpoint"))

    # ---- the card -------------------------------------------------------------------------
    def _card_bytes(self, pid: int) -> int:
        env = self._environ(pid)
        for name in ("GPUSHARE_CARD_MEMORY_MIB", "FAKE_TOTAL_MIB"):
            mib = _mib(env.get(name, "").split(",")[0])
            if mib:
                return mib * MIB
        return DEFAULT_CARD_MIB * MIB

    def _others(self, own: int, card: str) -> int:
        """What the other live processes' claims hold on ``card``."""
        total = 0
        try:
            names = os.listdir(self.folder)
        except OSError:
            return 0
        for name in names:
            stem, ext = os.path.splitext(name)
            if ext != ".json" or not stem.isascii() or not stem.isdigit() or int(stem) == own:
                continue
            if not os.path.exists(f"{self.proc}/{stem}"):
                continue
            claim = self._read(os.path.join(self.folder, name))
            if claim is not None and claim.get("card") == card:
                total += _mib(claim.get("mib")) * MIB
        return total


def _mib(value: object) -> int:
    try:
        n = int(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return 0
    return max(0, n)
