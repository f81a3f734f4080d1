"""GPUShareSpawner: KubeSpawner with a catalogue of GPU-memory slices.

The glue between JupyterHub/KubeSpawner and the pure modules beside it:
:mod:`gpushare_hub.core.catalogue` (what is offered), :mod:`.options` (what a request may
ask), :mod:`gpushare_hub.core.availability` (what fits now), :mod:`.pod` (the manifest edits),
:mod:`.hibernation` (room for hibernating kernels' copies) and :mod:`.progress` (what a waiting
user reads).

The class is joined from rooms, one mixin each (:mod:`.room` says how): :mod:`.settings` (the
catalogue's settings), :mod:`.ledgerview` (the ledger and the reflector's pods),
:mod:`.budgets` (quotas and GiB·h budgets), :mod:`.form` (the spawn form), :mod:`.request`
(``load_user_options``), :mod:`.manifest` (the pod) and :mod:`.starting` (start and progress).
Here: the catalogue (and, with ``gpu_hibernation``, the profiles' memory limits) checked at
construction and in a hub's config, and the hub's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubespawner import KubeSpawner  # type: ignore[import-untyped]

from gpushare_hub.core.catalogue import Catalogue, CatalogueError
from gpushare_hub.core.catalogueread import read_catalogue

from .dra import ALLOCATIONS, DEVICE_PLUGIN, DRA, check_dra_catalogue
from .hibernation import BASE_DEFAULT, BASE_TRAIT, check_hibernation, read_bytes
from .manifest import SliceManifest
from .refused import SpawnRefused
from .request import SpawnRequest
from .starting import SpawnStart
from .stored import guard_stored_options

# JupyterHub stores a REST request's user_options before this spawner sees them: bound what it
# stores, so that no request can leave a row that breaks every later spawn (see stored.py).
guard_stored_options()

STATE_SLICE = "gpushare_slice"
STATE_GIB = "gpushare_gib"

__all__ = ["STATE_GIB", "STATE_SLICE", "GPUShareSpawner", "SpawnRefused"]


class GPUShareSpawner(SpawnStart, SpawnRequest, SliceManifest, KubeSpawner):  # type: ignore[misc]
    """KubeSpawner whose profiles include GPU-memory slices placed by the gpushare scheduler."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        profiles = self.profile_list
        if not callable(profiles):
            listed = self._sorted_dict_values(profiles)
            catalogue = read_catalogue(self.slices, listed, self.resource_names)
            if self.allocation == DRA:
                check_dra_catalogue(catalogue)
            if self.gpu_hibernation:
                base = self.gpu_hibernation_base_memory
                check_hibernation(catalogue, listed, self.mem_limit or None, base, self.resource_names)

    @classmethod
    def check_config(cls, config: Any) -> Catalogue:
        """Check the catalogue in a hub's config object; raise :class:`CatalogueError` if wrong.

        Call it at the end of ``jupyterhub_config.py`` (``GPUShareSpawner.check_config(c)``) so
        that a wrong catalogue stops the hub at start.
        """
        section = config.GPUShareSpawner
        slices = section.get("slices", [])
        profiles = section.get("profile_list", config.KubeSpawner.get("profile_list", []))
        if isinstance(profiles, Mapping):
            profiles = [profiles[k] for k in sorted(profiles)]
        catalogue = read_catalogue(slices, [] if callable(profiles) else profiles)
        allocation = section.get("allocation", DEVICE_PLUGIN)
        if allocation not in ALLOCATIONS:
            raise CatalogueError(
                f"GPUShareSpawner.allocation is {allocation!r}; it is one of {', '.join(ALLOCATIONS)}"
            )
        if allocation == DRA:
            check_dra_catalogue(catalogue)
        if section.get("gpu_hibernation", False) and not callable(profiles):
            base = read_bytes(section.get(BASE_TRAIT, BASE_DEFAULT), f"c.GPUShareSpawner.{BASE_TRAIT}") or 0
            limit = read_bytes(_configured(config, "mem_limit"), "c.GPUShareSpawner.mem_limit")
            check_hibernation(catalogue, profiles, limit or None, base)
        return catalogue

    # ---- state --------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        state: dict[str, Any] = super().get_state()
        if self.gpushare_slice:
            state[STATE_SLICE] = self.gpushare_slice
            state[STATE_GIB] = self.gpushare_gib
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        slug = state.get(STATE_SLICE)
        self.gpushare_slice = slug if isinstance(slug, str) else None
        self.gpushare_gib = int(state.get(STATE_GIB) or 0) if self.gpushare_slice else 0

    def clear_state(self) -> None:
        super().clear_state()
        self.gpushare_slice, self.gpushare_gib = None, 0


def _configured(config: Any, name: str) -> Any:
    """A spawner setting as traitlets gives it to GPUShareSpawner: its own section's, else
    KubeSpawner's, else Spawner's (None: not set)."""
    for cls in ("GPUShareSpawner", "KubeSpawner", "Spawner"):
        if cls in config and name in config[cls]:
            return config[cls][name]
    return None
