"""Reading the device plugin's usage annotation on a Node (``gpushare-hub.io/usage``). Pure.

The plugin writes it (:meth:`gpushare_hub.isolation.usage.UsageReport.annotation`); every
reader (the hub service's report, ``api/v1/me``) reads it here, with bounds: a Node's
annotation is written by the node's plugin, but a reader must not trust its size or shape.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

# What a user reads where a node publishes no usage (api/v1/me, the status bar).
NOT_MEASURED = "usage not measured on this node"
MAX_CHARS = 1_000_000
MAX_ROWS = 10_000


@dataclass(frozen=True)
class NodeUsage:
    """GPU memory in use per pod (``namespace/name``) and card UUID, and per card in all."""

    pods: Mapping[tuple[str, str], int]
    cards: Mapping[str, int]

    def of_pod(self, key: str, card: str) -> int:
        return self.pods.get((key, card), 0)


def read_usage(raw: object) -> NodeUsage | None:
    """The usage on a node, or None where it is not measured (no annotation, or one that is not
    the plugin's shape: nothing is better than a wrong figure)."""
    if not isinstance(raw, str) or not raw or len(raw) > MAX_CHARS:
        return None
    try:
        d = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(d, dict) or not isinstance(d.get("pods", []), list):
        return None
    pods: dict[tuple[str, str], int] = {}
    for row in d.get("pods", [])[:MAX_ROWS]:
        if not isinstance(row, dict):
            continue
        pod, card, used = row.get("pod"), row.get("card"), row.get("usedMiB")
        if isinstance(pod, str) and isinstance(card, str) and _mib(used):
            pods[(pod, card)] = pods.get((pod, card), 0) + int(used)  # type: ignore[arg-type]
    cards: dict[str, int] = {}
    raw_cards = d.get("cards", {})
    if isinstance(raw_cards, dict):
        for card, row in list(raw_cards.items())[:MAX_ROWS]:
            used = row.get("usedMiB") if isinstance(row, Mapping) else None
            if _mib(used):
                cards[str(card)] = int(used)  # type: ignore[arg-type]
    return NodeUsage(pods, cards)


def _mib(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40
