"""The what-if's cards (:func:`~gpushare_hub.core.planning.replay`), with hibernation or without.

Hibernation: a notebook left idle ``after`` seconds has its GPU memory checkpointed into host
memory and keeps its slice on the card, where it wakes. With an overcommit factor ``F``, a card
holds slices of at most ``F`` x its GiB, while the slices *awake* (not hibernated) fit in it::

    on every card, at every moment: awake GiB <= card GiB and held GiB <= F x card GiB

The history records each session's total idle seconds, not when they were. The model takes the
idle time as the end of the session (a notebook left open after the work is done): a session
that held its slice ``hold`` seconds, ``idle`` of them idle, with ``idle > after``, is awake for
``hold - idle + after`` seconds from its placement, then hibernated until its release; any other
session, and one whose idle time was not measured (None), is awake throughout. A hibernated
session never wakes in the model, so between placements a card's awake GiB only falls.

The packer is the plain what-if's own (a :class:`~.ledger.Ledger` and the
:class:`~.policy.Placer`), unchanged: each card offers ``H = floor(F x card GiB)`` units, and a
card in use also holds a *cover* of ``max(0, H - card GiB - hibernated GiB)`` units. A slice
then fits a card exactly when both rules hold with it (held + slice + cover <= H), the placer's
free units are the lesser of the two rooms (binpack's fullest card is the one whose tighter room
is smallest), and as covers sit only on cards in use, the ledger's cards in use are the cards
holding slices. With ``F = 1`` and nothing hibernated there is no cover: the plain what-if.

The lower bound mirrors the plain one (Martello and Toth's L2, :func:`~.bounds.l2`, which
dominates ceil(GiB / capacity)), taken on both rules: the larger of L2 of the awake sizes on
the card's GiB and L2 of the held sizes on ``H``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .annotations import CardShare
from .bounds import l2
from .demand import Demand
from .errors import GPUShareError
from .ledger import Ledger, Placement
from .overcommit import MAX_OVERCOMMIT

MAX_FACTOR = MAX_OVERCOMMIT


class HibernationError(GPUShareError, ValueError):
    """A hibernation what-if that cannot be run as asked; the message names the value and the fix."""


@dataclass(frozen=True)
class Hibernation:
    """Hibernate a notebook after ``after`` seconds idle; cards hold ``factor`` x their GiB."""

    after: float
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.after) and self.after > 0):
            raise HibernationError(
                f"hibernate after: {self.after!r} seconds is not above 0; give the minutes idle "
                "before a notebook hibernates, e.g. 20"
            )
        if not (math.isfinite(self.factor) and 1 <= self.factor <= MAX_FACTOR):
            raise HibernationError(
                f"overcommit: {self.factor!r} is not from 1 to {MAX_FACTOR:g}; give the share of a "
                "card's memory its slices may hold together, e.g. 2"
            )

    def awake_for(self, hold: float, idle: float | None) -> float:
        """Seconds of ``hold`` the session is awake, from its placement (the module's model)."""
        if idle is None or idle <= self.after:
            return hold
        return hold - min(idle, hold) + self.after

    def held_gib(self, card_gib: int) -> int:
        """The GiB a card's slices may hold together, awake or not: floor(factor x card GiB)."""
        return math.floor(self.factor * card_gib + 1e-9)


@dataclass
class _Card:
    node: str
    uuid: str
    index: int
    sessions: int = 0
    hibernated: int = 0  # GiB
    cover: int = 0  # units of the cover now in the ledger


@dataclass
class Cards:
    """Which session holds what on which card, awake or hibernated, over ``ledger`` (whose
    cards offer ``held_gib`` units each). Pure; :func:`~.planning.replay` drives it."""

    ledger: Ledger
    card_gib: int
    held_gib: int
    awake_sizes: dict[int, int] = field(default_factory=dict)  # size -> sessions awake
    held_sizes: dict[int, int] = field(default_factory=dict)  # size -> sessions, awake or not
    _where: dict[str, tuple[_Card, int]] = field(default_factory=dict)  # key -> (card, size)
    _asleep: set[str] = field(default_factory=set)
    _cards: dict[str, _Card] = field(default_factory=dict)

    def demand(self, key: str, size: int) -> Demand:
        """A session of ``size`` GiB (a whole card where it takes all a card holds)."""
        return Demand(key=key, per_card=None if size == self.held_gib else size, count=1)

    def placed(self, placement: Placement, size: int) -> None:
        """The placer committed ``placement`` (one card) for a session of ``size`` GiB, awake."""
        share = placement.cards[0]
        card = self._cards.setdefault(share.uuid, _Card(placement.node, share.uuid, share.index))
        card.sessions += 1
        self._where[placement.key] = (card, size)
        _count(self.awake_sizes, size, 1)
        _count(self.held_sizes, size, 1)
        self._cover(card)

    def hibernate(self, key: str) -> None:
        """The session ``key`` hibernates: its GiB stay held on its card, no longer awake."""
        card, size = self._where[key]
        self._asleep.add(key)
        card.hibernated += size
        _count(self.awake_sizes, size, -1)
        self._cover(card)

    def release(self, key: str) -> None:
        """The session ``key`` ends, awake or hibernated."""
        card, size = self._where.pop(key)
        self.ledger.release(key)
        card.sessions -= 1
        _count(self.held_sizes, size, -1)
        if key in self._asleep:
            self._asleep.remove(key)
            card.hibernated -= size
        else:
            _count(self.awake_sizes, size, -1)
        self._cover(card)

    def in_use(self) -> int:
        """Cards holding a session (awake or hibernated)."""
        return self.ledger.cards_in_use()

    def bound(self) -> int:
        """The lower bound on the cards the sessions held now need (see the module docstring)."""
        held = l2(self.held_sizes, self.held_gib)
        if self.held_gib == self.card_gib and not self._asleep:
            return held  # nothing overcommitted or hibernated: the plain what-if's bound
        return max(held, l2(self.awake_sizes, self.card_gib))

    def _cover(self, card: _Card) -> None:
        """Set the card's cover to what its sessions now need (none on a card without any)."""
        want = max(0, self.held_gib - self.card_gib - card.hibernated) if card.sessions else 0
        if want == card.cover:
            return
        key = f"cover:{card.uuid}"
        if card.cover:
            self.ledger.release(key)
        if want:
            share = CardShare(uuid=card.uuid, index=card.index, units=want)
            self.ledger.commit(Placement(key=key, node=card.node, cards=(share,)))
        card.cover = want


def _count(sizes: dict[int, int], size: int, n: int) -> None:
    sizes[size] = sizes.get(size, 0) + n
