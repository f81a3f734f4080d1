"""How many more of a slice fit now, and why not, from the same ledger as the extender.

Whether a slice can be placed is the core's own :class:`~gpushare_hub.core.Placer`
answer; how many more fit is counted over the cards the placer would consider
(allowed model, healthy) from the ledger's public reading methods. The outcome
is an :class:`Availability` value; :func:`render` turns it into the short text of
the spawn form ("7 free", "none free: the largest free block is 3 GiB"). Pure:
the caller passes the ledger (see :data:`LedgerProvider`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from gpushare_hub.core import Demand, Ledger, Placement, Placer
from gpushare_hub.core.isolation import WORDS, satisfies

# Something that returns the current ledger, or None while it has not been read yet
# (e.g. the shared informer before its first list).
LedgerProvider = Callable[[], Ledger | None]

_PLACERS: WeakKeyDictionary[Ledger, Placer] = WeakKeyDictionary()


def placer_for(ledger: Ledger) -> Placer:
    """One binpack placer per ledger, so that its per-node cache serves every form render."""
    placer = _PLACERS.get(ledger)
    if placer is None:
        placer = _PLACERS[ledger] = Placer(ledger, "binpack")
    return placer


@dataclass(frozen=True)
class Availability:
    """What the ledger says about one demand shape right now.

    ``free``: how many more such pods fit at once. ``placeable``: the placer would
    place one now. ``permanent``: it never fits in this cluster (larger than every
    allowed card, or no allowed card at all). ``largest_free``: per allowed model,
    the largest free block on one card; ``largest_card``: the largest allowed card.
    """

    free: int
    placeable: bool
    permanent: bool
    largest_free: Mapping[str, int] = field(default_factory=dict)
    largest_card: int = 0
    models: tuple[str, ...] = ()
    whole: bool = False
    reason: str = ""
    unit: str = "GiB"
    isolation: str | None = None  # the tier the demand requires


def _fits(slots: list[int], count: int) -> int:
    """How many pods that each need ``count`` distinct cards fit, card ``i`` taking ``slots[i]`` of them."""
    if count == 1:
        return sum(slots)
    best = 0
    for t in range(1, sum(slots) // count + 1):
        if sum(min(s, t) for s in slots) >= count * t:
            best = t
    return best


def availability(
    ledger: Ledger, demand: Demand, node_selector: Mapping[str, str] | None = None
) -> Availability:
    """Count and explain, for ``demand`` (see :meth:`Slice.demand`), on ``ledger``.

    ``node_selector``: the labels the pod will carry as its nodeSelector; only nodes that
    have them count (a free card on a node the pod may not use is no room for it).
    """
    free = 0
    largest_free: dict[str, int] = {}
    largest_card = 0
    wanted = dict(node_selector or {})
    nodes = [n for n in ledger.nodes() if n.matches(wanted)]
    for node in nodes:
        if not satisfies(node.isolation.effective, demand.isolation):
            continue  # its cards are no room for this demand
        slots = []
        for card in node.cards:
            if not card.healthy or not demand.model_allowed(card.model):
                continue
            left = ledger.free(node.name, card.uuid)
            largest_card = max(largest_card, card.units)
            largest_free[card.model] = max(largest_free.get(card.model, 0), left)
            if demand.per_card is None:
                slots.append(1 if left == card.units else 0)
            else:
                slots.append(left // demand.per_card)
        free += _fits(slots, demand.count)
    decision = placer_for(ledger).decide(demand, [n.name for n in nodes] if wanted else None)
    placeable = isinstance(decision, Placement)
    permanent = not placeable and decision.permanent  # type: ignore[union-attr]
    return Availability(
        free=free,
        placeable=placeable,
        permanent=permanent,
        largest_free=dict(sorted(largest_free.items())),
        largest_card=largest_card,
        models=demand.models,
        whole=demand.whole,
        reason="" if placeable else decision.reason,  # type: ignore[union-attr]
        unit=ledger.names.unit,
        isolation=demand.isolation,
    )


def render(a: Availability | None) -> str:
    """The form's text for one slice."""
    if a is None:
        return "availability unknown: the GPU inventory has not been read yet"
    models = "/".join(a.models) or "GPU"
    if a.permanent:
        if not a.largest_card and a.isolation:
            return f"unavailable: no {models} card here is on a node with a {WORDS[a.isolation]}"
        if not a.largest_card:
            return f"unavailable: this cluster has no {models} card"
        return f"unavailable: the largest {models} card here holds {a.largest_card} {a.unit}"
    if a.free > 0:
        return f"{a.free} free"
    if a.whole:
        return f"none free: no {models} card is entirely free"
    blocks = dict(a.largest_free)
    if len(blocks) <= 1:
        return f"none free: the largest free block is {max(blocks.values(), default=0)} {a.unit}"
    return "none free: the largest free blocks are " + ", ".join(
        f"{b} {a.unit} ({m})" for m, b in blocks.items()
    )
