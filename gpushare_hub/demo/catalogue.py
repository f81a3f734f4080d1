"""The demo's slice catalogue: 3, 5 and 7 GiB of one card, and a whole card. Pure.

:func:`demo_slices` writes ``c.GPUShareSpawner.slices`` entries (the spawner checks them at
start, as any admin's catalogue); :func:`offered` is what the ready file lists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpushare_hub.core import normalize_model

from .cards import DemoCards

SLICE_GIB = (3, 5, 7)
_BRANDS = ("tesla-", "nvidia-")


@dataclass(frozen=True)
class Offered:
    """One entry of the demo's catalogue: ``gib`` of one ``model`` card (a whole card: its GiB)."""

    slug: str
    gib: int
    model: str
    whole: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"slug": self.slug, "gib": self.gib, "model": self.model, "whole": self.whole}


def slug_prefix(model: str) -> str:
    """``"Tesla T4"`` -> ``"t4"``, ``"A100-40GB"`` -> ``"a100-40gb"``: the start of each slug."""
    name = normalize_model(model).lower()
    for brand in _BRANDS:
        name = name.removeprefix(brand)
    return re.sub(r"[^a-z0-9-]+", "-", name).strip("-") or "gpu"


def offered(cards: DemoCards) -> list[Offered]:
    prefix = slug_prefix(cards.model)
    out = [Offered(f"{prefix}-{g}g", g, cards.model) for g in SLICE_GIB if g <= cards.gib]
    out.append(Offered(f"{prefix}-whole", cards.gib, cards.model, whole=True))
    return out


def demo_slices(cards: DemoCards) -> list[dict[str, Any]]:
    """``c.GPUShareSpawner.slices`` for the demo: the 5 GiB slice is the spawn page's default."""
    model = normalize_model(cards.model)
    entries: list[dict[str, Any]] = []
    for o in offered(cards):
        entry: dict[str, Any] = {"slug": o.slug, "models": [model]}
        if o.whole:
            entry.update(
                display_name=f"{cards.model} · whole card",
                cards=1,
                description=f"All {o.gib} GiB of one card, for you alone.",
            )
        else:
            entry.update(
                display_name=f"{cards.model} · {o.gib} GiB",
                gib=o.gib,
                description=f"{o.gib} of the card's {cards.gib} GiB; the rest is shared with others.",
                default=o.gib == 5,
            )
        entries.append(entry)
    return entries
