"""The dashboard's planning view (``GET api/v1/planning``, admin scope): the hub's own history
replayed against other cluster sizes and catalogues (:mod:`~gpushare_hub.core.planning`).

It is computed only when an admin asks, in a worker thread, one request at a time and within
a bound on the work (replays x sessions), so that neither the page's refresh nor the other
users' requests wait on it. What is not asked comes from the hub as it is: the cards of the
ledger (their commonest model, cards per node, a few counts either side of today's) and the
GiB sizes of the catalogue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..accounting.book import Book
from ..core.catalogue import Catalogue
from ..core.ledger import Ledger
from ..core.planning import (
    MAX_CARDS,
    Plan,
    PlanningError,
    Session,
    parse_cards_range,
    parse_catalogue,
    recorded,
    sessions_from_held,
    sweep,
)
from ..core.policy import POLICIES

MAX_REPLAYS = 64
# Replays x spawns one request may ask: up to about a minute of one core (a replay costs
# about a tenth of a millisecond per spawn).
MAX_WORK = 400_000
MAX_CARDS_IN_ALL = 20_000  # the cards of every what-if's cluster, summed
AROUND = 3  # default card counts: today's, and this many either side


@dataclass(frozen=True)
class ClusterShape:
    """What today's cluster looks like, for the defaults."""

    cards: int
    model: str
    mib: int
    per_node: int


def cluster_shape(ledger: Ledger | None) -> ClusterShape:
    """The commonest card model of the ledger (its MiB, its cards per node) and all its cards."""
    nodes = [node for node in ledger.nodes() if node.cards] if ledger is not None else []
    cards = [c for node in nodes for c in node.cards]
    if not cards:
        return ClusterShape(0, "Tesla-T4", 15360, 1)
    model, _ = Counter(c.model for c in cards).most_common(1)[0]
    mib = Counter(c.mib for c in cards if c.model == model).most_common(1)[0][0] or 15360
    per_node = Counter(sum(1 for c in node.cards if c.model == model) for node in nodes).most_common(1)[0][0]
    return ClusterShape(len(cards), model, mib, max(1, per_node))


def catalogue_sizes(catalogue: Catalogue, card_gib: int) -> tuple[int, ...]:
    """The GiB of the catalogue's single-card slices that a card of ``card_gib`` holds (whole
    cards need no size; a larger slice was never held)."""
    return tuple(
        sorted({s.gib for s in catalogue.slices if s.gib is not None and s.cards == 1 and s.gib <= card_gib})
    )


def plans_for(query: Mapping[str, str], shape: ClusterShape, sizes: tuple[int, ...]) -> list[Plan]:
    """The what-ifs a query asks (``cards``, ``catalogue`` with ``;`` between catalogues,
    ``policy`` with ``,`` between policies), the rest from today's cluster and catalogue."""
    if "cards" in query:
        counts = parse_cards_range(query["cards"])
    else:
        base = max(1, shape.cards)
        counts = list(range(max(1, base - AROUND), min(MAX_CARDS, base + AROUND) + 1))
    if "catalogue" in query:
        catalogues = [parse_catalogue(c) for c in query["catalogue"].split(";") if c.strip()]
        if not catalogues:
            raise PlanningError(
                "catalogue: empty; write sizes in GiB, catalogues separated by ';', e.g. 3,5,7;4,8"
            )
    else:
        catalogues = [sizes]
    policies = [p.strip() for p in query.get("policy", "binpack").split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise PlanningError(
            f"policy: {(unknown or [''])[0][:40]!r} is not a policy; "
            f"choose from {', '.join(sorted(POLICIES))}"
        )
    total = len(counts) * len(catalogues) * len(policies)
    if total > MAX_REPLAYS:
        raise PlanningError(
            f"that asks {total} replays ({len(counts)} card counts x {len(catalogues)} catalogues x "
            f"{len(policies)} policies); ask for at most {MAX_REPLAYS}"
        )
    return [
        Plan(cards=n, model=shape.model, mib=shape.mib, per_node=shape.per_node, catalogue=cat, policy=policy)
        for policy in policies
        for cat in catalogues
        for n in counts
    ]


def check_work(sessions: Sequence[Session], plans: Sequence[Plan]) -> None:
    cards = sum(p.cards for p in plans)
    if cards > MAX_CARDS_IN_ALL:
        raise PlanningError(
            f"the what-ifs have {cards:,} cards in all, more than {MAX_CARDS_IN_ALL:,}; "
            "ask for fewer or smaller card counts"
        )
    work = len(sessions) * len(plans)
    if work > MAX_WORK:
        raise PlanningError(
            f"{len(plans)} replays of {len(sessions):,} spawns is more than one request may ask; "
            "give a later since, or fewer card counts or catalogues"
        )


def plan_from_history(
    book: Book, since: float, until: float, now: float, plans: Sequence[Plan]
) -> tuple[list[Session], dict[str, Any] | None]:
    """The sessions the book holds between ``since`` and ``until`` and, when there are any, the
    figures of every plan (None without sessions). Run in the worker thread: reading the book
    and replaying it take time; :class:`PlanningError` past the bound on work."""
    sessions = sessions_from_held(book.intervals(since, until), now)
    if not sessions:
        return sessions, None
    check_work(sessions, plans)
    return sessions, plan_document(sessions, plans)


def plan_document(sessions: Sequence[Session], plans: Sequence[Plan]) -> dict[str, Any]:
    """The figures of every plan (run in a worker thread: it takes seconds)."""
    return {"recorded": recorded(sessions), "rows": sweep(sessions, plans)}
