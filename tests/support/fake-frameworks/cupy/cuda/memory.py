"""``cupy.cuda.memory`` of the fake CuPy: its memory pools and allocators, as CuPy's memory.pyx has them.

A pool keeps every block it took from the card (``total_bytes``) and gives a freed one to the next
allocation of a size it fits; a device's pool reads ``CUPY_GPU_MEMORY_LIMIT`` (bytes, or a
percentage of the card) when it is made, at the first per-device call, and ``set_limit`` replaces
it (0: no limit). Past the limit, or past what the card has left after freeing its cached blocks,
an allocation raises :class:`OutOfMemoryError` with CuPy's message.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from . import ERROR_MEMORY_ALLOCATION, CUDARuntimeError, _card_bytes, _free, _malloc, get_device_id

ALLOCATION_UNIT_SIZE = 512


class OutOfMemoryError(MemoryError):
    """CuPy's out-of-memory error (its message, word for word)."""

    def __init__(self, size: int, total: int, limit: int = 0) -> None:
        if limit == 0:
            msg = f"Out of memory allocating {size:,} bytes"
            if total != -1:
                msg += f" (allocated so far: {total:,} bytes)."
        else:
            msg = (
                f"Out of memory allocating {size:,} bytes "
                f"(allocated so far: {total:,} bytes, limit set to: {limit:,} bytes)."
            )
        super().__init__(msg)


def _round_size(size: int) -> int:
    return -(-size // ALLOCATION_UNIT_SIZE) * ALLOCATION_UNIT_SIZE


def _parse_limit_string(limit: str | None = None) -> dict[str, Any]:
    if limit is None:
        limit = os.environ.get("CUPY_GPU_MEMORY_LIMIT")
    if limit is not None and limit.endswith("%"):
        return {"size": None, "fraction": float(limit[:-1]) / 100.0}
    return {"size": int(limit) if limit is not None else None, "fraction": None}


class MemoryPointer:
    """A block of device memory; collected, it goes back to its pool."""

    def __init__(self, pool: SingleDeviceMemoryPool | None, ptr: int, size: int) -> None:
        self._pool = weakref.ref(pool) if pool is not None else None
        self.ptr, self.size = ptr, size

    def __del__(self) -> None:
        pool = self._pool() if self._pool is not None else None
        if pool is not None:
            pool.free(self.ptr, self.size)
        elif self._pool is None and self.size:
            _free(self.size)


class SingleDeviceMemoryPool:
    def __init__(self) -> None:
        self._device_id = get_device_id()
        self._lock = threading.RLock()
        self._in_use: dict[int, int] = {}
        self._free: list[tuple[int, int]] = []  # (size, ptr)
        self._total_bytes = 0
        self._limit = 0
        self._next = 1
        self.set_limit(**_parse_limit_string())

    def malloc(self, size: int) -> MemoryPointer:
        size = _round_size(size)
        with self._lock:
            fits = sorted(block for block in self._free if block[0] >= size)
            if fits:
                self._free.remove(fits[0])
                block, ptr = fits[0]
            else:
                block, ptr = size, self._try_malloc(size)
            self._in_use[ptr] = block
        return MemoryPointer(self, ptr, block)

    def _try_malloc(self, size: int) -> int:
        total = self._total_bytes + size
        if self._limit != 0 and self._limit < total:
            raise OutOfMemoryError(size, total - size, self._limit)
        try:
            _malloc(size)
        except CUDARuntimeError as err:
            if err.status != ERROR_MEMORY_ALLOCATION:
                raise
            self.free_all_blocks()
            try:
                _malloc(size)
            except CUDARuntimeError:
                raise OutOfMemoryError(size, self._total_bytes, self._limit) from None
        self._total_bytes += size
        self._next += 1
        return self._next

    def free(self, ptr: int, size: int) -> None:
        with self._lock:
            if self._in_use.pop(ptr, None) is not None:
                self._free.append((size, ptr))

    def free_all_blocks(self, stream: object = None) -> None:
        with self._lock:
            for size, _ptr in self._free:
                _free(size)
                self._total_bytes -= size
            self._free = []

    def n_free_blocks(self) -> int:
        return len(self._free)

    def used_bytes(self) -> int:
        return sum(self._in_use.values())

    def free_bytes(self) -> int:
        return sum(size for size, _ptr in self._free)

    def total_bytes(self) -> int:
        return self._total_bytes

    def set_limit(self, size: int | None = None, fraction: float | None = None) -> None:
        if size is None:
            if fraction is None:
                size = 0
            else:
                if not 0 <= fraction <= 1:
                    raise ValueError(f"memory limit fraction out of range: {fraction}")
                size = int(fraction * _card_bytes())
        elif fraction is not None:
            raise ValueError("size and fraction cannot be specified at one time")
        if size < 0:
            raise ValueError(f"memory limit size out of range: {size}")
        with self._lock:
            self._limit = int(size)

    def get_limit(self) -> int:
        return self._limit


class MemoryPool:
    """Memory pool for all GPU devices on the host: a pool per device, made at its first use."""

    def __init__(self, allocator: Callable[[int], Any] | None = None) -> None:
        self._pools: dict[int, SingleDeviceMemoryPool] = {}

    def _pool(self) -> SingleDeviceMemoryPool:
        device = get_device_id()
        if device not in self._pools:
            self._pools[device] = SingleDeviceMemoryPool()
        return self._pools[device]

    def malloc(self, size: int) -> MemoryPointer:
        return self._pool().malloc(size)

    def free_all_blocks(self, stream: object = None) -> None:
        self._pool().free_all_blocks(stream)

    def n_free_blocks(self) -> int:
        return self._pool().n_free_blocks()

    def used_bytes(self) -> int:
        return self._pool().used_bytes()

    def free_bytes(self) -> int:
        return self._pool().free_bytes()

    def total_bytes(self) -> int:
        return self._pool().total_bytes()

    def set_limit(self, size: int | None = None, fraction: float | None = None) -> None:
        self._pool().set_limit(size, fraction)

    def get_limit(self) -> int:
        return self._pool().get_limit()


class PinnedMemoryPool:
    """Pinned (page-locked) host memory: what it holds is host memory, never the card's."""

    def __init__(self) -> None:
        self._in_use = 0
        self._total = 0

    def malloc(self, size: int) -> int:
        self._in_use += size
        self._total = max(self._total, self._in_use)
        return size

    def used_bytes(self) -> int:
        return self._in_use

    def total_bytes(self) -> int:
        return self._total

    def free_all_blocks(self) -> None:
        self._total = self._in_use

    def n_free_blocks(self) -> int:
        return 0


def _malloc_raw(size: int) -> MemoryPointer:
    """Without a pool: cudaMalloc itself (CuPy's ``_malloc``)."""
    try:
        _malloc(size)
    except CUDARuntimeError:
        raise OutOfMemoryError(size, -1) from None
    return MemoryPointer(None, 1, size)


def _pinned_raw(size: int) -> int:
    return size


_current_allocator: Callable[[int], Any] = _malloc_raw
_pinned_allocator: Callable[[int], Any] = _pinned_raw
_thread_local = threading.local()


def alloc(size: int) -> Any:
    """Calls the current allocator."""
    return get_allocator()(size)


def set_allocator(allocator: Callable[[int], Any] | None = None) -> None:
    global _current_allocator
    if getattr(_thread_local, "allocator", None) is not None:
        raise ValueError("Can't change the global allocator inside `using_allocator` context manager")
    _current_allocator = allocator if allocator is not None else _malloc_raw


def get_allocator() -> Callable[[int], Any]:
    allocator = getattr(_thread_local, "allocator", None)
    return _current_allocator if allocator is None else allocator


@contextlib.contextmanager
def using_allocator(allocator: Callable[[int], Any] | None = None) -> Iterator[None]:
    previous = getattr(_thread_local, "allocator", None)
    _thread_local.allocator = allocator
    try:
        yield
    finally:
        _thread_local.allocator = previous


def set_pinned_memory_allocator(allocator: Callable[[int], Any] | None = None) -> None:
    global _pinned_allocator
    _pinned_allocator = allocator if allocator is not None else _pinned_raw


def alloc_pinned_memory(size: int) -> Any:
    return _pinned_allocator(size)
