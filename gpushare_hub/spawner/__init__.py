"""GPUShareSpawner and its pure parts: catalogue, options, availability, pod edits, progress."""

from .spawner import GPUShareSpawner, SpawnRefused

__all__ = ["GPUShareSpawner", "SpawnRefused"]
