"""GPUShareSpawner built for unit tests: KubeSpawner's mock mode, no API server, no ledger watch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from jupyterhub import orm
from traitlets.config import Config

from gpushare_hub import GPUShareSpawner
from gpushare_hub.core import Ledger


def mock_spawner(
    slices: Sequence[dict[str, Any]],
    groups: Sequence[Any] = (),
    ledger: Ledger | None = None,
    name: str = "",
    **traits: Any,
) -> GPUShareSpawner:
    """A spawner with this catalogue and these traits; ``ledger``: what its provider returns
    (none: availability unknown). Patch ``kubespawner.spawner.load_config`` first (it reads a
    kubeconfig when a spawner is made): :func:`no_kubeconfig`."""
    c = Config()
    c.GPUShareSpawner.slices = list(slices)
    c.GPUShareSpawner.watch_ledger = False  # no API server here: a ledger is given or none
    for k, v in traits.items():
        setattr(c.GPUShareSpawner, k, v)
    if ledger is not None:
        c.GPUShareSpawner.ledger_provider = lambda: ledger
    sp = GPUShareSpawner(_mock=True, config=c, orm_spawner=orm.Spawner(name=name))
    sp.user.groups = list(groups)
    sp.user.spawners = {"": sp}
    return sp


def no_kubeconfig(monkeypatch: Any) -> Callable[..., None]:
    """KubeSpawner reads a kubeconfig when constructed; these tests talk to no cluster."""
    patched: Callable[..., None] = lambda **kw: None  # noqa: E731
    monkeypatch.setattr("kubespawner.spawner.load_config", patched)
    return patched


class Reflector:
    """KubeSpawner's pod reflector as GPUShareSpawner reads it: ``pods`` by ``namespace/name``."""

    def __init__(self, *pods: dict[str, Any]) -> None:
        self.pods = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}


class HeldStart:
    """Stands in for KubeSpawner's ``_start`` (creating the pod and waiting for Running): it
    waits an hour, and says when it was cancelled."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def __call__(self) -> tuple[str, int]:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return ("10.0.0.1", 8888)
