"""CUDA's process checkpoint API, called on another process of the same container: hibernation.

The driver's ``cuCheckpointProcessLock``, ``...Checkpoint``, ``...Restore``, ``...Unlock`` and
``...GetState`` move a CUDA process's GPU memory into host memory and back (NVIDIA: they "pause
GPU work and suspend a CUDA process to allow other applications to make use of GPU resources").
Measured on a real card (docs/measurements/, ../shared/reference): called by ctypes on
``libcuda.so.1`` after ``cuInit(0)``, with NULL arguments, from a second process of the same user;
states 1 after lock, 2 after checkpoint, 1 after restore, 0 after unlock; a CUDA call of the
checkpointed process blocks until it is restored and unlocked, it does not fail.

:class:`LibCuda` is that, by ctypes (the lock is given a timeout, so that a kernel busy on the GPU
is not waited for without end). :class:`~gpushare_hub.isolation.simcheckpoint.SimulatedCheckpoint`
models the same calls for the fake GPU framework of the demo and the tests. :func:`driver_for`
picks one from the server's environment. Every failure is a :class:`CheckpointError` with the
driver's code and words for a person.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Protocol

from gpushare_hub.core.names import SIM_USAGE_DIR_ENV

# CUprocessState
RUNNING, LOCKED, CHECKPOINTED, FAILED = 0, 1, 2, 3
STATE_NAMES = {RUNNING: "running", LOCKED: "locked", CHECKPOINTED: "checkpointed", FAILED: "failed"}

# CUresult values the calls answer with (cuda.h).
SUCCESS = 0
INVALID_VALUE = 1
OUT_OF_MEMORY = 2
NOT_INITIALIZED = 3
NO_DEVICE = 100
ILLEGAL_STATE = 401
NOT_FOUND = 500
NOT_SUPPORTED = 801
TIMEOUT = 909
CODE_NAMES = {
    SUCCESS: "CUDA_SUCCESS",
    INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
    OUT_OF_MEMORY: "CUDA_ERROR_OUT_OF_MEMORY",
    NOT_INITIALIZED: "CUDA_ERROR_NOT_INITIALIZED",
    NO_DEVICE: "CUDA_ERROR_NO_DEVICE",
    ILLEGAL_STATE: "CUDA_ERROR_ILLEGAL_STATE",
    NOT_FOUND: "CUDA_ERROR_NOT_FOUND",
    NOT_SUPPORTED: "CUDA_ERROR_NOT_SUPPORTED",
    TIMEOUT: "CUDA_ERROR_TIMEOUT",
}
NO_DRIVER = -1  # ours: no libcuda, or one without the checkpoint API

LOCK_TIMEOUT_MS = 10_000


class CheckpointError(Exception):
    """A checkpoint call the driver refused: ``code`` (a CUresult, or :data:`NO_DRIVER`)."""

    def __init__(self, call: str, code: int, words: str = "") -> None:
        self.call = call
        self.code = code
        name = CODE_NAMES.get(code, f"CUresult {code}") if code != NO_DRIVER else "no driver"
        super().__init__(f"{call}: {name}" + (f" ({words})" if words else ""))

    @property
    def out_of_memory(self) -> bool:
        return self.code == OUT_OF_MEMORY


class Checkpointer(Protocol):
    """The five calls, on a process of this container."""

    def lock(self, pid: int, timeout_ms: int = LOCK_TIMEOUT_MS) -> None: ...
    def checkpoint(self, pid: int) -> None: ...
    def restore(self, pid: int) -> None: ...
    def unlock(self, pid: int) -> None: ...
    def state(self, pid: int) -> int: ...


class _LockArgs(ctypes.Structure):
    """``CUcheckpointLockArgs``: a timeout in ms, the rest reserved (zero)."""

    _fields_ = [
        ("timeoutMs", ctypes.c_uint),
        ("reserved0", ctypes.c_uint),
        ("reserved1", ctypes.c_uint64 * 7),
    ]


CALLS = (
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "cuCheckpointProcessGetState",
)


class LibCuda:
    """The calls on the NVIDIA driver's ``libcuda.so.1`` (loaded on first use)."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        self.library = library
        self._lib: ctypes.CDLL | None = None

    def _load(self) -> ctypes.CDLL:
        if self._lib is not None:
            return self._lib
        try:
            lib = ctypes.CDLL(self.library)
        except OSError as err:
            raise CheckpointError(
                "load",
                NO_DRIVER,
                f"{self.library} cannot be loaded ({err}): hibernation needs the NVIDIA driver's "
                "library in this container, which the card's CDI spec or the NVIDIA container "
                "toolkit mounts",
            ) from None
        missing = [name for name in CALLS if not hasattr(lib, name)]
        if missing:
            raise CheckpointError(
                "load",
                NO_DRIVER,
                f"this driver's {self.library} has no {', '.join(missing)}: hibernation needs a "
                "driver with CUDA's process checkpoint API",
            )
        status = lib.cuInit(0)
        if status != SUCCESS:
            raise CheckpointError("cuInit", status, self._words(lib, status))
        self._lib = lib
        return lib

    @staticmethod
    def _words(lib: ctypes.CDLL, status: int) -> str:
        text = ctypes.c_char_p()
        if lib.cuGetErrorString(status, ctypes.byref(text)) == SUCCESS and text.value:
            return text.value.decode(errors="replace")
        return ""

    def _call(self, name: str, pid: int, arg: object = None) -> None:
        lib = self._load()
        status = getattr(lib, name)(ctypes.c_int(pid), arg)
        if status != SUCCESS:
            raise CheckpointError(name, status, self._words(lib, status))

    def lock(self, pid: int, timeout_ms: int = LOCK_TIMEOUT_MS) -> None:
        args = _LockArgs(timeoutMs=max(0, int(timeout_ms)))
        self._call("cuCheckpointProcessLock", pid, ctypes.byref(args))

    def checkpoint(self, pid: int) -> None:
        self._call("cuCheckpointProcessCheckpoint", pid)

    def restore(self, pid: int) -> None:
        self._call("cuCheckpointProcessRestore", pid)

    def unlock(self, pid: int) -> None:
        self._call("cuCheckpointProcessUnlock", pid)

    def state(self, pid: int) -> int:
        lib = self._load()
        value = ctypes.c_int(-1)
        status = lib.cuCheckpointProcessGetState(ctypes.c_int(pid), ctypes.byref(value))
        if status != SUCCESS:
            raise CheckpointError("cuCheckpointProcessGetState", status, self._words(lib, status))
        return value.value


def driver_for(env: Mapping[str, str]) -> Checkpointer:
    """The simulated driver where the node is simulated (``$GPUSHARE_SIM_USAGE_DIR``, the fake
    GPU framework's claims), else the NVIDIA driver's library."""
    folder = env.get(SIM_USAGE_DIR_ENV, "").strip()
    if folder:
        from .simcheckpoint import SimulatedCheckpoint

        return SimulatedCheckpoint(folder)
    return LibCuda()
