"""Valid objects, mutated one field at a time: the fuzz tier's and the unit tier's property tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into a decoded JSON value (the value itself first)."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*prefix, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from paths(child, (*prefix, i))


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """A deep copy of ``value`` with the item at ``path`` replaced by ``new`` (``...``: removed)."""
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    parent = copy
    for key in path[:-1]:
        parent = parent[key]
    if new is ...:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return copy
