"""The base of GPUShareSpawner's rooms (settings, ledger view, budgets, form, request, manifest,
start): each room is a mixin holding its traits and methods, and ``GPUShareSpawner`` joins them
in front of KubeSpawner.

A room derives from :class:`traitlets.HasTraits` at run time, as ``QuotaSettings`` does, so that
its traits, defaults and validators join the spawner's (config stays ``c.GPUShareSpawner.x``:
only ``Configurable`` classes name config sections). To the type checker it is a KubeSpawner, so
that ``self.user``, ``self.log``, ``super().progress()`` and the like type as they did in one class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubespawner import KubeSpawner as SpawnerRoom  # type: ignore[import-untyped]
else:
    from traitlets import HasTraits as SpawnerRoom

__all__ = ["SpawnerRoom"]
