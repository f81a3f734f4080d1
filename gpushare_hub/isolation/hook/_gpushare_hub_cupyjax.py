"""gpushare-hub's start-up hook, CuPy and JAX in the container ledger: what they hold counts.

Part of the start-up hook: ``sitecustomize.py`` beside it loads this file once CuPy or JAX is
imported in a container with a ledger (``$GPUSHARE_LEDGER_DIR``; ``_gpushare_hub_ledgersync.py``),
on MPS nodes too. Before this, only PyTorch published what it held: a CuPy process holding 3 GiB
was invisible, and a PyTorch neighbour took 3 GiB more of a 5 GiB slice (issue 47).

* **CuPy** (:func:`join_cupy`): its process holds what its default memory pool holds on the card
  (``get_default_memory_pool().total_bytes()``; the pinned pool is host memory and does not count).
  Its start in the ledger is its first allocation: the hook puts a one-time allocator in front of
  CuPy's (``cupy.cuda.set_allocator``) that puts CuPy's own back, starts the process's place in
  the ledger (counted fresh), sets the pool's limit to what the slice has left
  (``set_limit(size=...)``) and allocates. From then on the limit is set again whenever the cap
  changes (a PyTorch neighbour filling the slice lowers it within a tick); a limit the user set
  (``set_limit``) stands, and what the process holds still counts. Nothing touches CUDA before
  CuPy itself does, so a fork after ``import cupy`` stays safe. An allocator the user puts in
  place before the first allocation (``set_allocator``) replaces the hook's: that process's CuPy
  is not counted, as a user's own cap is theirs.
* **JAX** (:func:`join_jax`): what its local devices' allocators hold on the card, from
  ``memory_stats()`` (``pool_bytes``, ``bytes_reserved`` or ``bytes_in_use``, the largest), read
  only once its backend has started (never starting it). Its cap cannot change: XLA reads
  ``XLA_PYTHON_CLIENT_MEM_FRACTION`` once, when the backend starts, so JAX's cap is what the slice
  had left when it was imported (``_gpushare_hub_caps.py``); what it holds still counts against
  the others, whose caps shrink.

Each framework is read defensively: any exception publishes nothing new and never reaches the
user's code. Standard library only, Python 3.8 or later, as the hook.
"""

from __future__ import annotations

import os
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpushare_hub.isolation.hook import _gpushare_hub_caps as caps
else:  # loaded by sitecustomize.py before this module
    import _gpushare_hub_caps as caps

applied, _debug = caps.applied, caps._debug
CUPY_VAR = caps.START_CAPS["cupy"]
JAX_BRIDGE = "jax._src.xla_bridge"  # its ``_backends`` fills when JAX's backend starts
JAX_HELD = ("pool_bytes", "bytes_reserved", "bytes_in_use")


def join_cupy(cupy: Any, shared: Any) -> None:
    """Count CuPy's default pool from its first allocation on, and set its limit as the cap changes."""
    cuda = cupy.cuda
    pool = cupy.get_default_memory_pool()
    original = cuda.get_allocator()
    once = threading.Lock()
    done: list[bool] = []
    ours: list[int | None] = [None]  # the limit this hook set last (None: none yet)

    def env_limit() -> int | None:
        raw = os.environ.get(CUPY_VAR, "").strip()
        return None if raw.endswith("%") else int(raw) if raw.isdigit() else 0

    def apply(cap: int) -> None:
        current = int(pool.get_limit())
        expected = env_limit() if ours[0] is None else ours[0]
        if expected is not None and current != expected:
            if ours[0] != -1:
                applied.append(f"cupy: the pool's limit is the user's ({current} bytes); it stands")
            ours[0] = -1  # the user set it: never again
            return
        limit = max(int(cap), 1)  # CuPy's 0 is no limit at all
        pool.set_limit(size=limit)
        if ours[0] is None:  # the first only: what follows is the ledger's
            applied.append(
                f"cupy: get_default_memory_pool().set_limit(size={limit}), and again as the cap changes"
            )
        ours[0] = limit

    def held() -> int:
        return int(pool.total_bytes())

    def first(size: int) -> Any:
        with once:
            if not done:
                done.append(True)
                try:
                    if cuda.get_allocator() is first:
                        cuda.set_allocator(original)
                    cap = shared.begin()  # what the slice has left, counted fresh
                    apply(cap)
                    shared.follow(held, apply, cap)
                except Exception as err:  # a failure here must not fail the user's allocation
                    _debug(f"could not count CuPy in the container ledger: {err!r}")
        return original(size)

    cuda.set_allocator(first)
    applied.append("cupy: counted in the container ledger from its first allocation")


def _jax_held(jax: Any) -> int:
    """What JAX's local devices hold on the card, 0 before its backend started (never started here)."""
    if not getattr(sys.modules.get(JAX_BRIDGE), "_backends", None):
        return 0
    total = 0
    for device in jax.local_devices():
        stats = device.memory_stats()
        if isinstance(stats, dict):  # None on a CPU device
            found = [v for v in (stats.get(k) for k in JAX_HELD) if isinstance(v, int) and v > 0]
            total += max(found, default=0)
    return total


def join_jax(jax: Any, shared: Any) -> None:
    """Count what JAX holds (its cap was taken at its import and cannot change)."""
    shared.follow(lambda: _jax_held(jax))
    applied.append("jax: counted in the container ledger (its cap is the one it started with)")
