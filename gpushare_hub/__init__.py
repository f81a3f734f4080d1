"""gpushare-hub. ``gpushare_hub.GPUShareSpawner`` is imported on first use, so that the
placement core (``gpushare_hub.core``) stays free of JupyterHub and KubeSpawner imports."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .spawner import GPUShareSpawner

__all__ = ["GPUShareSpawner"]


def __getattr__(name: str) -> Any:
    if name == "GPUShareSpawner":
        from .spawner import GPUShareSpawner

        return GPUShareSpawner
    raise AttributeError(f"module 'gpushare_hub' has no attribute {name!r}")
