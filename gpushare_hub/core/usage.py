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
class PodUse:
    """What one pod's processes do on one card, as its node's plugin last published it."""

    used_mib: int = 0
    sm_util: int | None = None  # percent of the card's SMs; None: not measured
    idle_since: int | None = None  # Unix seconds it has been idle from; None: active or not measured
    uid: str = ""


@dataclass(frozen=True)
class NodeUsage:
    """What each pod (``namespace/name``) does on each card UUID, and memory per card in all."""

    pods: Mapping[tuple[str, str], PodUse]
    cards: Mapping[str, int]

    def of_pod(self, key: str, card: str) -> PodUse:
        """A pod holding a slice with no process on the card holds nothing (and, where the
        node measures nothing else, nobody can say more)."""
        return self.pods.get((key, card), PodUse())


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
    pods: dict[tuple[str, str], PodUse] = {}
    for row in d.get("pods", [])[:MAX_ROWS]:
        if not isinstance(row, dict):
            continue
        pod, card, used = row.get("pod"), row.get("card"), row.get("usedMiB")
        if isinstance(pod, str) and isinstance(card, str) and _mib(used):
            util, since, uid = row.get("smUtil"), row.get("idleSince"), row.get("uid")
            pods[(pod, card)] = PodUse(
                int(used),  # type: ignore[arg-type]
                util if _whole(util, 100) else None,
                since if _whole(since, 1 << 40) else None,
                uid if isinstance(uid, str) and len(uid) <= 64 else "",
            )
    cards: dict[str, int] = {}
    raw_cards = d.get("cards", {})
    if isinstance(raw_cards, dict):
        for card, row in list(raw_cards.items())[:MAX_ROWS]:
            used = row.get("usedMiB") if isinstance(row, Mapping) else None
            if _mib(used):
                cards[str(card)] = int(used)  # type: ignore[arg-type]
    return NodeUsage(pods, cards)


def _whole(value: object, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def _mib(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 40
