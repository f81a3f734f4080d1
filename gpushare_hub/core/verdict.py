"""A node's verdict on a demand, as a value, and the words people read about it.

The placer (:mod:`.policy`) answers, for each node, whether a demand fits there now
(:attr:`Kind.FEASIBLE`), could fit once others leave (:attr:`Kind.NOT_NOW`), or never fits
as asked (:attr:`Kind.NEVER`), and why (:class:`Reason`). Code that acts on a verdict (the
extender, the replay, the metrics, the placer's own summary) switches on these values;
:func:`explain` is the one place where a verdict becomes the sentence a user reads (the
pod's PodScheduled condition, its events, the spawn progress page).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .cards import Card
from .demand import Demand
from .isolation import WORDS
from .resources import ResourceNames


class Kind(Enum):
    """Whether a demand fits on a node."""

    FEASIBLE = "feasible"
    NOT_NOW = "not now"  # some card could hold it once other pods leave
    NEVER = "never"  # it never fits there as asked


class Reason(Enum):
    """Why a demand does not fit on a node. What :attr:`Verdict.have` and
    :attr:`Verdict.asked` count depends on the reason (see each member)."""

    CPU = "cpu"  # have: millicores free (not now) or in all (never); asked: the pod's millicores
    MEMORY = "memory"  # host memory: as CPU, in MiB
    MODEL = "model"  # no card of a model the pod allows (never); models: the node's models
    UNHEALTHY = "unhealthy"  # every card the pod may use is unhealthy (not now)
    HANDING_CARDS = "handing-cards"  # whole cards are being handed to another pod (not now, transient)
    HANDING_SLICE = "handing-slice"  # a slice of this size (asked) on cards (cards) is being handed out
    TOO_FEW_CARDS = "too-few-cards"  # have: usable cards; asked: cards (never)
    NO_EMPTY_CARDS = "no-empty-cards"  # have: empty cards; asked: whole cards (not now)
    TOO_BIG = "too-big"  # have: units of the largest usable card; asked: units per card (never)
    NO_ROOM = "no-room"  # have: cards with the slice free; asked: cards; cards: unhealthy ones (not now)
    NO_CARDS = "no-cards"  # the node offers no GPU-sharing cards the ledger knows (never)
    UNREADABLE = "unreadable"  # the node's card inventory cannot be read; detail says why (never)
    ISOLATION = "isolation"  # the node enforces a tier (detail) other than the one the pod requires (never)


_TRANSIENT = frozenset({Reason.HANDING_CARDS, Reason.HANDING_SLICE})


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node's answer for one demand shape.

    Feasible: ``rank`` (the policy's key, lower wins) and ``chosen`` (the cards it would take,
    with their free units). Not now: ``free`` and ``card`` are the largest free block on a card
    the pod may use and that card's index (-1: none).
    """

    node: str
    kind: Kind
    reason: Reason | None = None  # None when feasible
    have: int = 0
    asked: int = 0
    free: int = 0
    card: int = -1
    rank: tuple[float, ...] = ()
    chosen: tuple[tuple[Card, int], ...] = ()
    cards: tuple[int, ...] = ()  # card indexes the reason concerns (-1: a card the node no longer has)
    models: tuple[str, ...] = ()
    detail: str = ""

    @property
    def feasible(self) -> bool:
        return self.kind is Kind.FEASIBLE

    @property
    def transient(self) -> bool:
        """A hold that lifts by itself within seconds: a handout the device plugin has not served yet."""
        return self.reason in _TRANSIENT


def _cards(indexes: tuple[int, ...]) -> str:
    return ", ".join(f"card {'?' if i < 0 else i}" for i in indexes)


def explain(v: Verdict, demand: Demand, names: ResourceNames) -> str:
    """The sentence a user reads about ``v``, the verdict of node ``v.node`` on ``demand``."""
    node, phrase, fmt = v.node, demand.model_phrase(), names.fmt
    never = v.kind is Kind.NEVER
    match v.reason:
        case None:
            return f"node {node} can hold {demand.describe(names)}"
        case Reason.CPU:
            return f"node {node} has {v.have}m CPU{'' if never else ' free'}, the pod asks {v.asked}m"
        case Reason.MEMORY:
            return (
                f"node {node} has {v.have} MiB memory{'' if never else ' free'}, the pod asks {v.asked} MiB"
            )
        case Reason.MODEL:
            return f"node {node} has no card of an allowed model (it has {', '.join(v.models)})"
        case Reason.UNHEALTHY:
            return f"node {node}: every card is unhealthy"
        case Reason.HANDING_CARDS:
            # Another user's pod is not named: this text reaches the waiting pod's owner.
            return (
                f"node {node} is still handing whole cards (aliyun.com/gpu-count) to another "
                "pod; a second such pod now would be ambiguous for the device plugin, so "
                "this pod waits until that allocation is done"
            )
        case Reason.HANDING_SLICE:
            return (
                f"node {node} is still handing a {fmt(v.asked)} slice of {_cards(v.cards)} to "
                "another pod; a second one on another card now would be ambiguous for the device "
                "plugin, so this pod waits until that allocation is done"
            )
        case Reason.TOO_FEW_CARDS:
            return f"node {node} has {v.have} usable {phrase}card(s), the pod asks {v.asked}"
        case Reason.NO_EMPTY_CARDS:
            return f"node {node} has {v.have} empty {phrase}card(s), the pod asks {v.asked} whole card(s)"
        case Reason.TOO_BIG:
            return (
                f"{phrase}cards on node {node} hold at most {fmt(v.have)}, "
                f"the pod asks {fmt(v.asked)} on one card"
            )
        case Reason.NO_ROOM:
            sick = f"; card {', '.join(map(str, v.cards))} is unhealthy and not used" if v.cards else ""
            per_card = demand.per_card or 0
            if v.asked == 1:
                return (
                    f"no {phrase}card on node {node} has {fmt(per_card)} free; the largest free "
                    f"block is {fmt(v.free)} (card {v.card}){sick}"
                )
            return (
                f"node {node} has {v.have} {phrase}card(s) with {fmt(per_card)} free, "
                f"the pod asks {v.asked}{sick}"
            )
        case Reason.NO_CARDS:
            return f"node {node} offers no {names.memory} (no GPU-sharing cards known)"
        case Reason.ISOLATION:
            return (
                f"node {node} enforces {v.detail} isolation ({WORDS.get(v.detail, v.detail)}), the pod "
                f"requires {demand.isolation} ({WORDS.get(demand.isolation or '', demand.isolation)})"
            )
        case Reason.UNREADABLE:
            return f"node {node}: its card inventory is unreadable, so nothing is placed there ({v.detail})"
