"""A node's ResourceSlice for the DRA path, and the names in it (pure).

The DRA kubelet plugin (:mod:`gpushare_hub.plugin.dra`) publishes one ResourceSlice per node:
pool = the node's name, one device per card (``gpu-<index>``) that many claims may share
(``allowMultipleAllocations``), with a consumable ``memory`` capacity in bytes (the card's
shareable units, after any reserve) whose request policy offers exactly the catalogue's sizes
(``validValues``; without sizes a range in whole units). Attributes name the card (UUID, model,
index) and the isolation tier the node claims, for DeviceClass selectors and for the hub.

**Order.** Kubernetes' allocator takes, on the node the scheduler chose, the first device in the
slice whose free capacity fits. The plugin lists the cards fullest first (:func:`fullest_first`),
so that first fit is best fit; it publishes again, with the pool's generation bumped, when the
order or anything else changes (:func:`same_content`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from .cards import Card, normalize_model
from .digits import ascii_int
from .errors import GPUShareError
from .names import (
    DRA_ATTR_INDEX,
    DRA_ATTR_ISOLATION,
    DRA_ATTR_MODEL,
    DRA_ATTR_UUID,
    DRA_CAPACITY,
    DRA_DEVICE_PREFIX,
    DRA_DRIVER,
)
from .resources import parse_quantity

API_VERSION = "resource.k8s.io/v1"
MAX_VALID_VALUES = 10  # resource.k8s.io/v1 CapacityRequestPolicy.validValues
GIB = 1 << 30
MIB = 1 << 20


class SizesError(GPUShareError, ValueError):
    """The sizes the plugin was told to offer cannot be a request policy; the message says why."""


def slice_name(node: str) -> str:
    """The node's ResourceSlice (a DNS subdomain of at most 253 characters, as node names are)."""
    return f"gpushare-hub-{node}"[:253].rstrip(".-")


def device_name(index: int) -> str:
    return f"{DRA_DEVICE_PREFIX}{index}"


def card_index(device: object) -> int | None:
    """The card index a device name of ours names (``gpu-3`` -> 3), else ``None``."""
    if not isinstance(device, str) or not device.startswith(DRA_DEVICE_PREFIX) or len(device) > 16:
        return None
    return ascii_int(device[len(DRA_DEVICE_PREFIX) :], 4)


def format_bytes(n: int) -> str:
    """Bytes as the quantity a person reads: ``5Gi``, ``512Mi``, else plain bytes."""
    for size, suffix in ((GIB, "Gi"), (MIB, "Mi")):
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def words(n: int) -> str:
    """Bytes in a message: ``5 GiB``, ``4.5 GiB``."""
    gib = Decimal(n) / GIB
    return f"{gib.normalize():f} GiB" if gib == gib.to_integral() else f"{gib:.2f} GiB"


def parse_sizes(raw: str | Sequence[str]) -> tuple[int, ...]:
    """``"3Gi,5Gi,7Gi"`` (or a list) as ascending bytes, at most ten, each whole and positive."""
    items = [s.strip() for s in (raw.split(",") if isinstance(raw, str) else raw)]
    items = [s for s in items if s]
    out: set[int] = set()
    for item in items:
        try:
            value = parse_quantity(item)
        except ValueError as err:
            raise SizesError(f"memory size {item!r}: {err}; write sizes such as 3Gi,5Gi,7Gi") from None
        if value != value.to_integral() or value <= 0 or value > 1 << 50:
            raise SizesError(f"memory size {item!r} is not a whole positive number of bytes up to 1 PiB")
        out.add(int(value))
    if len(out) > MAX_VALID_VALUES:
        raise SizesError(
            f"{len(out)} memory sizes given; a ResourceSlice's request policy holds at most "
            f"{MAX_VALID_VALUES}: offer fewer slice sizes"
        )
    return tuple(sorted(out))


def request_policy(sizes: Sequence[int], capacity: int, unit_bytes: int) -> dict[str, Any] | None:
    """The capacity's request policy: the sizes that fit the card (smallest as default), or,
    without sizes, whole units up to the card. ``None`` where no size fits the card."""
    if sizes:
        fitting = [s for s in sorted(sizes) if s <= capacity]
        if not fitting:
            return None
        return {"default": format_bytes(fitting[0]), "validValues": [format_bytes(s) for s in fitting]}
    if capacity < unit_bytes:
        return None
    return {
        "default": format_bytes(unit_bytes),
        "validRange": {
            "min": format_bytes(unit_bytes),
            "max": format_bytes(capacity),
            "step": format_bytes(unit_bytes),
        },
    }


def fullest_first(cards: Sequence[Card], used: Mapping[str, int]) -> list[Card]:
    """The cards in the order first fit should try them: least free first, then by index."""
    return sorted(cards, key=lambda c: (c.units - used.get(c.uuid, 0), c.index))


def device(card: Card, unit_bytes: int, sizes: Sequence[int], tier: str) -> dict[str, Any] | None:
    capacity = card.units * unit_bytes
    policy = request_policy(sizes, capacity, unit_bytes)
    if policy is None or not card.healthy:
        return None
    return {
        "name": device_name(card.index),
        "allowMultipleAllocations": True,
        "attributes": {
            DRA_ATTR_UUID: {"string": card.uuid},
            DRA_ATTR_MODEL: {"string": normalize_model(card.model)},
            DRA_ATTR_INDEX: {"int": card.index},
            DRA_ATTR_ISOLATION: {"string": tier},
        },
        "capacity": {DRA_CAPACITY: {"value": format_bytes(capacity), "requestPolicy": policy}},
    }


def resource_slice(
    node: str,
    node_uid: str,
    cards: Sequence[Card],
    *,
    unit_bytes: int,
    sizes: Sequence[int],
    tier: str,
    generation: int,
    used: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The node's ResourceSlice: its healthy cards that fit a size, fullest first."""
    ordered = fullest_first(cards, used or {})
    devices = [d for c in ordered if (d := device(c, unit_bytes, sizes, tier)) is not None]
    meta: dict[str, Any] = {"name": slice_name(node), "labels": {"app.kubernetes.io/managed-by": DRA_DRIVER}}
    if node_uid:  # the Node owns it: a deleted node takes its slice with it
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def same_content(published: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """Whether a slice read back from the API server says what ``wanted`` says (the generation
    aside), so that nothing is written, and no generation bumped, when nothing changed."""
    a, b = published.get("spec") or {}, wanted.get("spec") or {}
    if not isinstance(a, Mapping):
        return False
    keys = ("driver", "nodeName", "devices")
    pool_a = a.get("pool") if isinstance(a.get("pool"), Mapping) else {}
    return all(a.get(k) == b.get(k) for k in keys) and (pool_a or {}).get("name") == b["pool"]["name"]
