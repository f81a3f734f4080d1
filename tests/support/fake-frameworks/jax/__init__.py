"""A fake ``jax`` for the start-up hook's tests: a GPU backend whose memory is bookkeeping.

Modelled on JAX's own API, only where the hook touches it:

* importing it starts no backend; the first call that needs one (``jax.devices()``,
  ``jax.local_devices()``, an array) starts it (a ``jax-backend-init`` event), and only then
  ``jax._src.xla_bridge._backends`` holds it, as in JAX;
* the backend reads ``XLA_PYTHON_CLIENT_MEM_FRACTION`` (default 0.75) of the card
  (``$FAKE_TOTAL_MIB``, else ``$GPUSHARE_CARD_MEMORY_MIB``, else 15360 MiB) once, when it starts,
  and preallocates it unless ``XLA_PYTHON_CLIENT_PREALLOCATE=false``, as XLA's BFC allocator;
* ``jax.numpy.zeros(n, dtype=jax.numpy.uint8)`` takes ``n`` bytes on device 0, and an allocation
  past the fraction raises ``jax.errors.JaxRuntimeError`` with XLA's ``RESOURCE_EXHAUSTED`` message;
* ``jax.local_devices()[0].memory_stats()`` says what the allocator holds (``bytes_in_use``,
  ``pool_bytes``, ``bytes_limit``, ...), as XLA's allocator statistics.
"""

from __future__ import annotations

from typing import Any

from jax import errors, numpy
from jax._src import xla_bridge
from jax._src.xla_bridge import record

__version__ = "0.4.35"
__all__ = ["devices", "errors", "local_devices", "numpy"]


def devices(backend: str | None = None) -> list[Any]:
    return list(xla_bridge.get_backend().devices)


def local_devices(process_index: int | None = None, backend: str | None = None) -> list[Any]:
    return list(xla_bridge.get_backend().devices)


def device_count() -> int:
    return len(devices())


record("jax-import")
