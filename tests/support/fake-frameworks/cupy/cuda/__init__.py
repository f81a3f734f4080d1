"""``cupy.cuda`` of the fake CuPy: one card, its runtime's start, the current device, the allocators."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

MIB = 1024 * 1024
DEFAULT_CARD_MIB = 15360

_started = False
_device_bytes = 0  # what this process holds on the card (cudaMalloc less cudaFree)
_current = threading.local()  # the current device, per host thread (cudaSetDevice's)


def record(*event: Any) -> None:
    """Append one event to ``$FAKE_LOG`` (for tests), if set."""
    path = os.environ.get("FAKE_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(list(event)) + "\n")


def _card_bytes() -> int:
    for name in ("FAKE_TOTAL_MIB", "GPUSHARE_CARD_MEMORY_MIB"):
        raw = os.environ.get(name, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw) * MIB
    return DEFAULT_CARD_MIB * MIB


def _runtime() -> None:
    """The CUDA runtime starts (cuInit) at the first call that needs it: never at import."""
    global _started
    if not _started:
        _started = True
        record("cuda-init")


def get_device_id() -> int:
    _runtime()
    return int(getattr(_current, "id", 0))


class Device:
    """``cupy.cuda.Device``: one of the visible cards (here only device 0)."""

    def __init__(self, device: int | None = None) -> None:
        self.id = get_device_id() if device is None else int(device)
        if self.id != 0:
            raise RuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal ({self.id})")

    def use(self) -> None:
        _current.id = self.id

    def __enter__(self) -> Device:
        self._before = get_device_id()
        self.use()
        return self

    def __exit__(self, *exc: object) -> None:
        _current.id = self._before

    @property
    def mem_info(self) -> tuple[int, int]:
        """(free, total), as cudaMemGetInfo."""
        _runtime()
        return _card_bytes() - _device_bytes, _card_bytes()


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__("cudaErrorMemoryAllocation: out of memory")


ERROR_MEMORY_ALLOCATION = 2


def _malloc(size: int) -> None:
    """cudaMalloc: the card refuses what it does not have."""
    global _device_bytes
    _runtime()
    if _device_bytes + size > _card_bytes():
        raise CUDARuntimeError(ERROR_MEMORY_ALLOCATION)
    _device_bytes += size


def _free(size: int) -> None:
    global _device_bytes
    _device_bytes = max(0, _device_bytes - size)


from .memory import (  # noqa: E402 - memory uses the runtime above
    MemoryPointer,
    MemoryPool,
    OutOfMemoryError,
    PinnedMemoryPool,
    alloc,
    alloc_pinned_memory,
    get_allocator,
    set_allocator,
    set_pinned_memory_allocator,
    using_allocator,
)

__all__ = [
    "Device",
    "MemoryPointer",
    "MemoryPool",
    "OutOfMemoryError",
    "PinnedMemoryPool",
    "alloc",
    "alloc_pinned_memory",
    "get_allocator",
    "get_device_id",
    "set_allocator",
    "set_pinned_memory_allocator",
    "using_allocator",
]
