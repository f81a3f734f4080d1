"""What the dashboard shows of a node's hibernation (issue 46, part 4). Pure.

The device plugin of a node that overcommits its cards publishes its book on the Node
(``gpushare-hub.io/hibernation``, :func:`~.overcommit.book_annotation`): the factor, each card's
memory as sold, each pod's state (by pod UID) and each card's line to wake. The hub service reads
it back here, untrusted (:func:`read_node_hibernation`): an annotation that cannot be read, or
that says no overcommit, reads as none, and the rest of the node is shown as before. Per card
it adds up what the ledger says is held against what is hibernated (:func:`card_hibernation`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from .overcommit import HIBERNATED, MAX_BOOK_CHARS, MAX_OVERCOMMIT, Book, held_units, read_book

MAX_CARDS = 1000  # a node's cards, bounded all the same


@dataclass(frozen=True)
class NodeHibernation:
    """A node's overcommit as its plugin publishes it: the factor (above 1), each card's memory
    as sold (MiB, by UUID) and the book of its pods."""

    factor: float
    real_mib: Mapping[str, int]
    book: Book

    def hibernated_since(self, pod_uid: str, card: str) -> int | None:
        """Unix seconds since when the pod is hibernated on ``card`` (None: awake, or not in the book)."""
        rec = self.book.pods.get(pod_uid) if pod_uid else None
        if rec is None or rec.state != HIBERNATED or rec.card != card:
            return None
        return int(rec.since)

    def waiting(self, card: str) -> int:
        """How many pods wait to wake on ``card``."""
        return len(self.book.line.get(card, ()))


@dataclass(frozen=True)
class CardHibernation:
    """One card of an overcommitting node: every slice held on it, and those not hibernated,
    against what it may hold (``factor`` x its memory) and its memory as sold; MiB."""

    factor: float
    real_mib: int
    held_limit_mib: int
    held_mib: int
    awake_mib: int
    waiting: int

    def to_json(self) -> dict[str, object]:
        return {
            "factor": self.factor,
            "real_mib": self.real_mib,
            "held_limit_mib": self.held_limit_mib,
            "held_mib": self.held_mib,
            "awake_mib": self.awake_mib,
            "waiting": self.waiting,
        }


def read_node_hibernation(raw: str | None) -> NodeHibernation | None:
    """A Node's hibernation annotation, or None where there is none, it cannot be read, or its
    factor is not above 1 (and at most :data:`~.overcommit.MAX_OVERCOMMIT`). A card whose memory
    is not a whole number of MiB is left out (its row then shows no hibernation)."""
    if not raw or len(raw) > MAX_BOOK_CHARS:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    factor = doc.get("factor")
    if isinstance(factor, bool) or not isinstance(factor, int | float):
        return None
    if not math.isfinite(factor) or not 1.0 < factor <= MAX_OVERCOMMIT:
        return None
    cards = doc.get("cards")
    real: dict[str, int] = {}
    for uuid, sums in list(cards.items() if isinstance(cards, dict) else ())[:MAX_CARDS]:
        mib = sums.get("realMiB") if isinstance(sums, dict) else None
        if isinstance(uuid, str) and type(mib) is int and 0 < mib < 2**40:
            real[uuid] = mib
    return NodeHibernation(float(factor), real, read_book(raw))


def card_hibernation(
    hib: NodeHibernation | None, card: str, held_mib: int, hibernated_mib: int, mib_per_unit: int
) -> CardHibernation | None:
    """``card``'s sums on an overcommitting node (None elsewhere, or where its plugin gives no
    memory for it): ``held_mib`` every slice on it (the ledger's), ``hibernated_mib`` those of
    its slices the book records hibernated there."""
    real = hib.real_mib.get(card) if hib is not None else None
    if hib is None or real is None:
        return None
    mib = max(1, mib_per_unit)
    return CardHibernation(
        factor=hib.factor,
        real_mib=real,
        held_limit_mib=held_units(real // mib, hib.factor) * mib,
        held_mib=held_mib,
        awake_mib=max(0, held_mib - hibernated_mib),
        waiting=hib.waiting(card),
    )
