"""Who waits ahead of whom for a GPU: the rule the spawner's progress page, its form and the hub
service's ``api/v1/me`` share. Pure.

A spawn waits behind the older pending spawns that need at least the room it needs on a card
model it could use: a smaller spawn ahead does not hold it back (it fits where this one does not).
"""

from __future__ import annotations

from .demand import Demand


def models_overlap(a: Demand, b: Demand) -> bool:
    if not a.models or not b.models:
        return True
    return bool({m.lower() for m in a.models} & {m.lower() for m in b.models})


def as_large(theirs: Demand, mine: Demand) -> bool:
    """Whether a spawn asking ``theirs`` needs at least the room ``mine`` needs: whole cards
    for whole cards, and for a slice a slice as large or whole cards."""
    if mine.whole:
        return theirs.whole and theirs.count >= mine.count
    return theirs.whole or (theirs.per_card or 0) >= (mine.per_card or 0)


def holds_back(theirs: Demand, mine: Demand) -> bool:
    """Whether a spawn asking ``theirs``, waiting ahead, holds back one asking ``mine``."""
    return models_overlap(mine, theirs) and as_large(theirs, mine)
