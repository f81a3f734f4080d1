"""Free GPU memory that no offered slice can use: the dashboard's fragmentation figure. Pure.

The free units, summed over healthy cards, that no catalogued slice can use. A card's free
block is a fragment when it is smaller than the smallest slice that may run on the card's
model (a whole-card slice counts as the card's size); on a model that no slice may use, every
free unit is a fragment. An empty catalogue makes no fragments.

Unlike the FGD measure of :mod:`gpushare_hub.core.fragmentation` (expected waste under a
workload distribution, which steers placement), this is a plain count an admin can check by
eye on the dashboard's bars. The hub service shows it per card, per model and in all
(``api/v1/ledger``'s ``fragment`` and ``fragmentation`` keys, ``gpushare_fragmentation_gib``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpushare_hub.core.cards import model_matches
from gpushare_hub.core.catalogue import Slice
from gpushare_hub.core.reportrows import CardRow

DEFINITION = (
    "free memory on healthy cards whose free block is smaller than the smallest catalogued slice "
    "that may run on that card's model (all of it where no slice may)"
)


def smallest_slice(slices: Iterable[Slice], model: str, card_units: int) -> int | None:
    """Units of the smallest slice that may run on a card of ``model``; None: no slice may."""
    sizes = [
        s.gib if s.gib is not None else card_units
        for s in slices
        if not s.models or any(model_matches(model, m) for m in s.models)
    ]
    return min(sizes, default=None)


def card_fragment(card: CardRow, slices: Sequence[Slice]) -> int:
    """The free units of ``card`` that no catalogued slice can use (see the module docstring)."""
    free = max(card.units - card.used, 0)
    if not card.healthy or not slices or free == 0:
        return 0
    smallest = smallest_slice(slices, card.model, card.units)
    return free if smallest is None or free < smallest else 0
