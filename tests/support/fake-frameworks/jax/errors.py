"""``jax.errors`` of the fake JAX."""

from __future__ import annotations


class JaxRuntimeError(RuntimeError):
    """XLA's runtime error (JAX raises it for an allocation past its memory too)."""
