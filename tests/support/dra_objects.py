"""resource.k8s.io/v1 objects in the API server's JSON shape, for tests of the DRA path.

:func:`claim` builds a ResourceClaim as a notebook's template makes it (one request named
:data:`~gpushare_hub.core.names.DRA_REQUEST` of our DeviceClass), and :func:`allocated` writes
its status as kube-scheduler does (results with consumedCapacity, reservedFor); :func:`slice_obj`
and :func:`device_class` build what our driver publishes and the chart installs.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from gpushare_hub.core.names import (
    DRA_ATTR_INDEX,
    DRA_ATTR_ISOLATION,
    DRA_ATTR_MODEL,
    DRA_ATTR_UUID,
    DRA_CAPACITY,
    DRA_DEVICE_CLASS,
    DRA_DEVICE_PREFIX,
    DRA_DRIVER,
    DRA_REQUEST,
)

API_VERSION = "resource.k8s.io/v1"
GIB = 1024**3


def claim(name: str, ns: str = "jhub", uid: str = "", device_class: str = DRA_DEVICE_CLASS) -> dict[str, Any]:
    """An unallocated ResourceClaim asking one device of ``device_class`` (spec only)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-claim-{name}"},
        "spec": {
            "devices": {
                "requests": [{"name": DRA_REQUEST, "exactly": {"deviceClassName": device_class, "count": 1}}]
            }
        },
    }


def result(
    node: str,
    index: int,
    memory: object = 5 * GIB,
    driver: str = DRA_DRIVER,
    device: str | None = None,
) -> dict[str, Any]:
    """One allocation result: device ``gpu-<index>`` of ``node``'s pool; ``memory`` None leaves
    consumedCapacity out (a cluster without DRAConsumableCapacity)."""
    out: dict[str, Any] = {
        "request": DRA_REQUEST,
        "driver": driver,
        "pool": node,
        "device": device if device is not None else f"{DRA_DEVICE_PREFIX}{index}",
    }
    if memory is not None:
        out["consumedCapacity"] = {DRA_CAPACITY: memory if isinstance(memory, str) else str(memory)}
        out["shareID"] = "8d1f3c0a-0000-4000-8000-000000000001"
    return out


def allocated(
    obj: dict[str, Any],
    results: Sequence[dict[str, Any]],
    pods: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """``obj`` with the status kube-scheduler writes: ``results``, and reservedFor the ``pods``
    given as (name, uid)."""
    out = copy.deepcopy(obj)
    node = results[0]["pool"] if results else ""
    status: dict[str, Any] = {
        "allocation": {
            "devices": {"results": list(results)},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            },
        }
    }
    if pods:
        status["reservedFor"] = [{"resource": "pods", "name": n, "uid": u} for n, u in pods]
    out["status"] = status
    return out


def device_class() -> dict[str, Any]:
    """Our DeviceClass: every device of our driver."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": DRA_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRA_DRIVER}'"}}]},
    }


def slice_obj(
    node: str,
    cards: int = 2,
    gib: int = 15,
    sizes_gib: Sequence[int] = (3, 5, 7, 15),
    model: str = "Tesla-T4",
    isolation: str = "cooperative",
    consumable: bool = True,
) -> dict[str, Any]:
    """The ResourceSlice our driver publishes for ``node`` (``gpushare-hub-<node>``, pool =
    the node's name): one device per card, memory as a consumable capacity in bytes.
    ``consumable`` False leaves allowMultipleAllocations and the request policy out (an API
    server without DRAConsumableCapacity drops them)."""
    devices = []
    for i in range(cards):
        memory: dict[str, Any] = {"value": str(gib * GIB)}
        device: dict[str, Any] = {
            "name": f"{DRA_DEVICE_PREFIX}{i}",
            "attributes": {
                DRA_ATTR_UUID: {"string": f"GPU-sim-{node}-{i}"},
                DRA_ATTR_MODEL: {"string": model},
                DRA_ATTR_INDEX: {"int": i},
                DRA_ATTR_ISOLATION: {"string": isolation},
            },
            "capacity": {DRA_CAPACITY: memory},
        }
        if consumable:
            device["allowMultipleAllocations"] = True
            memory["requestPolicy"] = {
                "default": str(min(sizes_gib) * GIB),
                "validValues": [str(s * GIB) for s in sizes_gib],
            }
        devices.append(device)
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": f"gpushare-hub-{node}"},
        "spec": {
            "driver": DRA_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }
