"""Errors of the placement core. Every message names the object, the problem and the way out."""

from __future__ import annotations


class GPUShareError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidObject(GPUShareError, ValueError):
    """A Node or Pod object (or its annotations) cannot be read as gpushare-hub expects."""


class InvalidQuantity(InvalidObject):
    """A resource quantity is negative, fractional where units must be whole, or unparsable."""
