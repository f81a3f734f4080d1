"""A fake ``cupy`` for the start-up hook's tests: device memory through CuPy's memory pool, on no card.

Modelled on CuPy's own API (``cupy/__init__.py``, ``cupy/cuda/memory.pyx``), only where the hook
touches it:

* importing it starts no CUDA; the default memory pool and the default pinned pool are made at
  import and put in place with ``cupy.cuda.set_allocator`` (as CuPy does), and CUDA starts (a
  ``cuda-init`` event) at the first call that needs the runtime (an allocation, or a pool's
  per-device methods, which ask for the current device);
* ``cupy.empty(n, dtype=cupy.uint8)`` (also ``zeros``) takes ``n`` bytes through the current
  allocator; an array that is collected gives its block back to the pool, which keeps it
  (``total_bytes()``) until ``free_all_blocks()``;
* the pool refuses an allocation past its limit (``CUPY_GPU_MEMORY_LIMIT`` when the device's pool
  is made, then ``set_limit``) with ``cupy.cuda.memory.OutOfMemoryError`` and CuPy's message, and
  past the card (``$FAKE_TOTAL_MIB``, else ``$GPUSHARE_CARD_MEMORY_MIB``, else 15360 MiB) likewise;
* ``cupy.cuda.alloc_pinned_memory(n)`` takes host memory from the pinned pool.

``FAKE_LOG`` (a file): one JSON event a line, as the fake torch writes them.
"""

from __future__ import annotations

from typing import Any

from . import cuda
from .cuda import record

__version__ = "13.3.0"

_ITEMSIZE = {"uint8": 1, "int8": 1, "float16": 2, "float32": 4, "int32": 4, "float64": 8, "int64": 8}
uint8, int8, float16, float32, int32, float64, int64 = _ITEMSIZE


class ndarray:  # CuPy's name
    """An array on the card: its bytes are one block of the current allocator."""

    def __init__(self, shape: int | tuple[int, ...], dtype: str = "float64") -> None:
        self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.dtype = dtype
        count = 1
        for n in self.shape:
            count *= n
        self.nbytes = count * _ITEMSIZE[dtype]
        self.data = cuda.alloc(self.nbytes)


def empty(shape: int | tuple[int, ...], dtype: Any = float64) -> ndarray:
    return ndarray(shape, str(dtype))


zeros = empty

# set default allocator (as CuPy's __init__ does)
_default_memory_pool = cuda.MemoryPool()
_default_pinned_memory_pool = cuda.PinnedMemoryPool()

cuda.set_allocator(_default_memory_pool.malloc)
cuda.set_pinned_memory_allocator(_default_pinned_memory_pool.malloc)


def get_default_memory_pool() -> cuda.MemoryPool:
    return _default_memory_pool


def get_default_pinned_memory_pool() -> cuda.PinnedMemoryPool:
    return _default_pinned_memory_pool


record("cupy-import")
