"""The kubelet's Allocate and GetPreferredAllocation requests, read into typed values (pure).

Whatever dials the plugin's socket may send any device IDs, sizes and counts that the wire
types carry; only a kubelet sends IDs that this plugin announced. Each request is read here
before the plugin's state sees it, against the device IDs the plugin serves now: an unknown or
repeated ID, a size out of range, a must-include that is not available, or more container
requests than a pod can have is a :class:`BadRequest` (gRPC ``InvalidArgument``) naming the
container request and the field, and echoing at most a short prefix of the value. Nothing is
claimed or recorded for a refused request.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.shapes import MAX_CONTAINERS, shown


class BadRequest(GPUShareError):
    """A request the plugin refuses as malformed (gRPC ``InvalidArgument``)."""


@dataclass(frozen=True)
class PreferredAsk:
    """One container's GetPreferredAllocation question, checked."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


def _ids(values: Sequence[str], where: str, known: Collection[str]) -> tuple[str, ...]:
    if len(values) > len(known):
        raise BadRequest(f"{where}: {len(values)} device IDs, more than the {len(known)} this plugin serves")
    seen: set[str] = set()
    for value in values:
        if value not in known:
            raise BadRequest(f"{where}: {shown(value)} is not a device this plugin serves")
        if value in seen:
            raise BadRequest(f"{where}: {shown(value)} is named twice")
        seen.add(value)
    return tuple(values)


def _count(n: int, what: str) -> None:
    if n > MAX_CONTAINERS:
        raise BadRequest(f"{what}: {n} container requests, more than {MAX_CONTAINERS}")


def read_allocate(requests: Sequence[Sequence[str]], known: Collection[str]) -> list[tuple[str, ...]]:
    """Each container's device IDs from an AllocateRequest; ``known``: the IDs served now."""
    _count(len(requests), "container_requests")
    out = []
    for n, ids in enumerate(requests):
        where = f"container_requests[{n}].devices_ids"
        if not ids:
            raise BadRequest(f"{where}: no device IDs; Allocate is for at least one device")
        out.append(_ids(ids, where, known))
    return out


def read_preferred(
    requests: Sequence[tuple[Sequence[str], Sequence[str], int]], known: Collection[str]
) -> list[PreferredAsk]:
    """Each container's (available, must include, size) from a PreferredAllocationRequest."""
    _count(len(requests), "container_requests")
    out = []
    for n, (available, must, size) in enumerate(requests):
        where = f"container_requests[{n}]"
        avail = _ids(available, f"{where}.available_deviceIDs", known)
        included = _ids(must, f"{where}.must_include_deviceIDs", known)
        missing = [i for i in included if i not in set(avail)]
        if missing:
            raise BadRequest(
                f"{where}.must_include_deviceIDs: {shown(missing[0])} is not among available_deviceIDs"
            )
        if not 1 <= size <= len(avail):
            raise BadRequest(
                f"{where}.allocation_size: {size}, expected 1 to the {len(avail)} available device IDs"
            )
        if len(included) > size:
            raise BadRequest(
                f"{where}.must_include_deviceIDs: {len(included)} IDs, more than allocation_size {size}"
            )
        out.append(PreferredAsk(avail, included, size))
    return out
