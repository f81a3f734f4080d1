"""Annotation and label names on Pods and Nodes, and the allocation record's JSON form.

gpushare-compatible pod annotations (written at bind, read by old tooling):
``ALIYUN_COM_GPU_MEM_IDX`` card index, ``_POD`` pod total, ``_DEV`` card total,
``_ASSIGNED`` "false" until the plugin allocates, ``_ASSUME_TIME`` Unix ns.

Ours, which is what gpushare-hub trusts: ``gpushare-hub.io/allocation``, a JSON
record naming the node and, per card, its **UUID** and units, and per container
the card and units it gets. Indices can change across reboots; UUIDs cannot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import InvalidObject
from .jsonfields import load_annotation_json, whole_number
from .names import (
    ALLOCATION_ANNOTATION,
    GPU_MEM_ASSIGNED,
    GPU_MEM_ASSUME_TIME,
    GPU_MEM_DEV,
    GPU_MEM_IDX,
    GPU_MEM_POD,
)


@dataclass(frozen=True, order=True)
class CardShare:
    """``units`` of the card with ``uuid`` (index kept for gpushare compatibility)."""

    uuid: str
    index: int
    units: int


@dataclass(frozen=True, order=True)
class ContainerShare:
    """What one container gets: ``units`` on card ``uuid``."""

    container: str
    uuid: str
    units: int


@dataclass(frozen=True)
class AllocationRecord:
    node: str
    cards: tuple[CardShare, ...]
    containers: tuple[ContainerShare, ...]

    def to_json(self) -> str:
        return json.dumps(
            {
                "v": 1,
                "node": self.node,
                "cards": [{"uuid": c.uuid, "index": c.index, "units": c.units} for c in self.cards],
                "containers": [
                    {"name": c.container, "uuid": c.uuid, "units": c.units} for c in self.containers
                ],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str, *, where: str) -> AllocationRecord:
        fix = "delete the pod or remove the annotation so that it is scheduled again"
        d = load_annotation_json(raw, f"{where}: annotation {ALLOCATION_ANNOTATION}", fix)
        try:
            return cls(
                node=str(d["node"]),
                cards=tuple(
                    CardShare(
                        uuid=str(c["uuid"]),
                        index=whole_number(c["index"], "a card's index"),
                        units=whole_number(c["units"], "a card's units"),
                    )
                    for c in d["cards"]
                ),
                containers=tuple(
                    ContainerShare(
                        container=str(c["name"]),
                        uuid=str(c["uuid"]),
                        units=whole_number(c["units"], "a container's units"),
                    )
                    for c in d.get("containers", [])
                ),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise InvalidObject(
                f"{where}: annotation {ALLOCATION_ANNOTATION} is not a valid allocation record ({err}); {fix}"
            ) from err

    def pod_annotations(self, card_units: Mapping[str, int], assume_time_ns: int) -> dict[str, str]:
        """All annotations to write at bind. ``card_units``: UUID -> that card's total units."""
        first = min(self.cards, key=lambda c: c.index)
        return {
            ALLOCATION_ANNOTATION: self.to_json(),
            GPU_MEM_IDX: ",".join(str(c.index) for c in sorted(self.cards, key=lambda c: c.index)),
            GPU_MEM_POD: str(sum(c.units for c in self.cards)),
            GPU_MEM_DEV: str(card_units[first.uuid]),
            GPU_MEM_ASSIGNED: "false",
            GPU_MEM_ASSUME_TIME: str(assume_time_ns),
        }
