"""``jax._src.xla_bridge`` of the fake JAX: the backends, started once, and the GPU's allocator."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from jax.errors import JaxRuntimeError

MIB = 1024 * 1024
DEFAULT_CARD_MIB = 15360
REGION = 2 * MIB  # the allocator grows its pool by whole regions

_backends: dict[str, Any] = {}
_backend_lock = threading.Lock()


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


class GpuDevice:
    """A CUDA device of the backend, with its allocator (XLA's BFC allocator, in bookkeeping)."""

    platform = "gpu"
    device_kind = "Fake GPU (gpushare-hub)"

    def __init__(self, limit: int, preallocate: bool) -> None:
        self.id = 0
        self._lock = threading.Lock()
        self.limit = limit
        self.pool = limit if preallocate else 0
        self.in_use = self.peak = self.largest = self.allocs = 0

    def __repr__(self) -> str:
        return f"CudaDevice(id={self.id})"

    def allocate(self, nbytes: int) -> None:
        with self._lock:
            if self.in_use + nbytes > self.limit:
                raise JaxRuntimeError(
                    f"RESOURCE_EXHAUSTED: Out of memory while trying to allocate {nbytes} bytes."
                )
            self.in_use += nbytes
            if self.in_use > self.pool:
                self.pool = min(self.limit, -(-self.in_use // REGION) * REGION)
            self.peak, self.largest = max(self.peak, self.in_use), max(self.largest, nbytes)
            self.allocs += 1

    def free(self, nbytes: int) -> None:
        with self._lock:
            self.in_use = max(0, self.in_use - nbytes)

    def memory_stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "num_allocs": self.allocs,
                "bytes_in_use": self.in_use,
                "peak_bytes_in_use": self.peak,
                "largest_alloc_size": self.largest,
                "bytes_limit": self.limit,
                "bytes_reserved": 0,
                "peak_bytes_reserved": 0,
                "largest_free_block_bytes": self.pool - self.in_use,
                "pool_bytes": self.pool,
                "peak_pool_bytes": self.pool,
            }


class GpuClient:
    """The backend: reads its memory settings once, when it starts."""

    platform = "gpu"

    def __init__(self) -> None:
        fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))
        preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() not in ("false", "0")
        self.devices = [GpuDevice(int(fraction * _card_bytes()), preallocate)]
        record("jax-backend-init", fraction)


def backends() -> dict[str, Any]:
    with _backend_lock:
        if not _backends:
            _backends["cuda"] = GpuClient()
        return _backends


def get_backend(platform: str | None = None) -> Any:
    return backends()["cuda"]
