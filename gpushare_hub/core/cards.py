"""Cards and the nodes that hold them, read from Kubernetes Node objects.

A node's cards come from the inventory annotation the device plugin writes
(``gpushare-hub.io/cards``: UUID, index, model, MiB, units, health per card).
A node that only has gpushare-style capacity (``aliyun.com/gpu-mem`` and
``aliyun.com/gpu-count``, e.g. from Aliyun's old device plugin) is read as that
many equal cards with synthetic IDs, so existing clusters keep working.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .errors import InvalidObject
from .isolation import NodeIsolation, read_node_isolation
from .jsonfields import load_annotation_json, whole_number
from .names import (
    ALLOCATOR_ANNOTATION,
    CARDS_ANNOTATION,
    CHECKPOINT_ANNOTATION,
    DEVICE_MODE_ANNOTATION,
    ISOLATION_ANNOTATION,
    ISOLATION_CHECK_ANNOTATION,
    MODEL_LABEL,
)
from .objects import NodeObject
from .resources import DEFAULT_NAMES, ResourceNames, parse_units

# MiB that NVML reports for common cards (models normalised: spaces become dashes).
# Used where cards are declared rather than discovered (the simulated plugin, the replayer).
MODEL_MIB: dict[str, int] = {
    "Tesla-T4": 15360,
    "T4": 15360,
    "A10": 23028,
    "NVIDIA-A10": 23028,
    "L4": 23034,
    "A100-40GB": 40960,
    "A100-SXM4-40GB": 40960,
    "A100-80GB": 81920,
    "A100-SXM4-80GB": 81920,
    "H100-80GB-HBM3": 81559,
}


def normalize_model(name: str) -> str:
    """NVML names (``"Tesla T4"``) contain spaces, which labels cannot: ``"Tesla-T4"``."""
    return "-".join(name.split())


# Brand words that NVML puts before some model names and people leave out (or add).
_BRANDS = frozenset({"nvidia", "tesla"})


def _model_words(name: str) -> list[str]:
    words = normalize_model(name).lower().split("-")
    while len(words) > 1 and words[0] in _BRANDS:
        words.pop(0)
    return [w for w in words if w]


def model_matches(card_model: str, wanted: str) -> bool:
    """Both sides normalised the same way (case, spaces or dashes, a leading ``NVIDIA`` or
    ``Tesla``), then ``wanted``'s words must appear in a row in the card's: ``"T4"``,
    ``"tesla-t4"`` and ``"Tesla T4"`` match a ``Tesla-T4``; ``"NVIDIA A10"`` matches an
    ``A10`` and ``"A10"`` an ``NVIDIA-A10``, but ``"A10"`` never an ``A100``."""
    have, want = _model_words(card_model), _model_words(wanted)
    n = len(want)
    return n > 0 and any(have[i : i + n] == want for i in range(len(have) - n + 1))


@dataclass(frozen=True, order=True)
class Card:
    """One physical GPU. ``units`` is what may be handed out (after any reserve)."""

    index: int
    uuid: str
    model: str
    units: int
    mib: int = 0
    healthy: bool = True

    def __post_init__(self) -> None:
        if self.units < 0 or self.index < 0:
            raise InvalidObject(f"card {self.uuid}: negative index or size")


@dataclass(frozen=True)
class Node:
    """A GPU-sharing node: its cards in index order, and optionally host CPU and memory.

    ``cpu_milli`` / ``memory_mib`` are only set where the core itself must respect
    them (the trace replayer); in a cluster kube-scheduler checks them.
    ``allocator``: our device plugin serves this node and acknowledges allocations
    (see :class:`~gpushare_hub.core.policy.Placer` on ambiguous placements).
    ``isolation``: the tier the node enforces, as its plugin claims and checked it.
    """

    name: str
    cards: tuple[Card, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    cpu_milli: int | None = None
    memory_mib: int | None = None
    allocator: bool = False
    isolation: NodeIsolation = field(default_factory=NodeIsolation)

    def __post_init__(self) -> None:
        uuids = [c.uuid for c in self.cards]
        if len(set(uuids)) != len(uuids):
            raise InvalidObject(f"node {self.name}: two cards share a UUID: {uuids}")
        object.__setattr__(self, "cards", tuple(sorted(self.cards)))

    @property
    def units(self) -> int:
        return sum(c.units for c in self.cards)

    def matches(self, selector: Mapping[str, str]) -> bool:
        """Whether a pod with ``selector`` as its nodeSelector may land here."""
        return all(self.labels.get(k) == v for k, v in selector.items())

    def card(self, uuid: str) -> Card | None:
        for c in self.cards:
            if c.uuid == uuid:
                return c
        return None

    def card_by_index(self, index: int) -> Card | None:
        for c in self.cards:
            if c.index == index:
                return c
        return None


def declared_cards(
    node: str, count: int, model: str, mib: int, names: ResourceNames = DEFAULT_NAMES
) -> tuple[Card, ...]:
    """``count`` identical cards with stable made-up UUIDs (simulated nodes, the replayer)."""
    units = names.units_from_mib(mib)
    return tuple(
        Card(index=i, uuid=f"GPU-sim-{node}-{i}", model=normalize_model(model), units=units, mib=mib)
        for i in range(count)
    )


def cards_to_annotation(cards: Sequence[Card]) -> str:
    """The inventory annotation value the device plugin writes on its Node."""
    return json.dumps(
        [
            {
                "uuid": c.uuid,
                "index": c.index,
                "model": c.model,
                "mib": c.mib,
                "units": c.units,
                "healthy": c.healthy,
            }
            for c in sorted(cards)
        ],
        separators=(",", ":"),
    )


def _cards_from_annotation(node: str, raw: str) -> tuple[Card, ...]:
    where = f"node {node} annotation {CARDS_ANNOTATION}"
    items = load_annotation_json(raw, where, "the device plugin rewrites it on restart")
    if not isinstance(items, list):
        raise InvalidObject(f"{where}: expected a JSON list of cards, got {type(items).__name__}")
    cards = []
    for i, item in enumerate(items):
        try:
            cards.append(
                Card(
                    index=whole_number(item["index"], "index"),
                    uuid=str(item["uuid"]),
                    model=normalize_model(str(item.get("model", "unknown"))),
                    units=whole_number(item["units"], "units"),
                    mib=whole_number(item.get("mib", 0), "mib"),
                    healthy=bool(item.get("healthy", True)),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise InvalidObject(f"{where}: card #{i} lacks or mangles {err}") from err
    return tuple(cards)


def node_from_k8s(obj: NodeObject, names: ResourceNames = DEFAULT_NAMES) -> Node | None:
    """The cards of a Node (read by :func:`~.shapes.read_node`). ``None`` if it offers no GPU memory."""
    name, labels, annotations, capacity = obj.name, dict(obj.labels), obj.annotations, obj.capacity
    raw = annotations.get(CARDS_ANNOTATION)
    if raw:
        cards = _cards_from_annotation(name, raw)
    else:
        total = parse_units(capacity.get(names.memory, 0), what=f"node {name} capacity {names.memory}")
        if total == 0:
            return None
        count = parse_units(capacity.get(names.count, 1), what=f"node {name} capacity {names.count}") or 1
        model = normalize_model(labels.get(MODEL_LABEL, "unknown"))
        per = total // count
        cards = tuple(
            Card(index=i, uuid=f"{name}/gpu{i}", model=model, units=per, mib=per * names.mib_per_unit)
            for i in range(count)
        )
    if not cards:
        return None
    return Node(
        name=name,
        cards=cards,
        labels=labels,
        allocator=bool(annotations.get(ALLOCATOR_ANNOTATION)),
        isolation=read_node_isolation(
            name,
            annotations,
            ISOLATION_ANNOTATION,
            ISOLATION_CHECK_ANNOTATION,
            DEVICE_MODE_ANNOTATION,
            CHECKPOINT_ANNOTATION,
        ),
    )
