"""What a user waiting for a GPU server is told: a value per moment, rendered at the edge.

:func:`spawn_status` reads the ledger, the server's pod (API JSON) and the other
pods waiting for the same scheduler, and answers :class:`Bound` (node and card
chosen), :class:`Waiting` (why, and how many are ahead), or :class:`NeverFits`
(the spawn should fail now rather than at ``start_timeout``). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpushare_hub.core import AllocationRecord, Demand, GPUShareError, Ledger, PodObject, demand_from_pod
from gpushare_hub.core.availability import Availability, availability
from gpushare_hub.core.names import ALLOCATION_ANNOTATION
from gpushare_hub.core.queue import holds_back
from gpushare_hub.core.releases import Estimate, ReleaseHistory


@dataclass(frozen=True)
class Bound:
    node: str
    card_index: int
    uuid: str
    model: str
    units: int
    card_units: int
    cards: int = 1


@dataclass(frozen=True)
class Waiting:
    demand: Demand
    availability: Availability
    ahead: int  # spawns of the same or a larger size, of an overlapping model, that wait before it
    estimate: Estimate | None = None


@dataclass(frozen=True)
class NeverFits:
    demand: Demand
    availability: Availability


SpawnStatus = Bound | Waiting | NeverFits


def _created(pod: PodObject) -> tuple[str, str]:
    return (pod.creation_timestamp, pod.name)


def queue_position(pod: PodObject, queue: Iterable[PodObject], demand: Demand) -> int:
    """Pods created before ``pod``, not yet bound, asking as much GPU memory (or more) of an
    overlapping model: a smaller spawn ahead does not hold this one back."""
    return waiting_ahead(queue, demand, pod.scheduler_name, before=pod)


def waiting_ahead(
    queue: Iterable[PodObject], demand: Demand, scheduler: str, before: PodObject | None = None
) -> int:
    """Pods of ``scheduler`` not yet bound that ask as much as ``demand`` (or more) of an
    overlapping model; with ``before``, only those created before that pod (a new spawn would
    wait behind all of them)."""
    mine = _created(before) if before is not None else None
    ahead = 0
    for other in queue:
        if before is not None and other.key == before.key:
            continue
        if other.node_name or other.scheduler_name != scheduler or other.phase in ("Succeeded", "Failed"):
            continue
        if mine is not None and _created(other) >= mine:
            continue
        try:
            theirs = demand_from_pod(other)
        except GPUShareError:
            continue
        if theirs is not None and holds_back(theirs, demand):
            ahead += 1
    return ahead


def spawn_status(
    ledger: Ledger,
    pod: PodObject,
    queue: Iterable[PodObject] = (),
    history: ReleaseHistory | None = None,
    now: float = 0.0,
) -> SpawnStatus | None:
    """Where the server's pod stands. ``None``: it asks for no GPU memory. ``history`` and
    ``now`` (its clock): the recent releases a waiting spawn's estimate comes from."""
    demand = demand_from_pod(pod, ledger.names)
    if demand is None:
        return None
    raw = pod.annotations.get(ALLOCATION_ANNOTATION)
    if raw:
        rec = AllocationRecord.from_json(raw, where=f"pod {demand.key}")
        first = min(rec.cards, key=lambda c: c.index)
        node = ledger.node(rec.node)
        card = node.card(first.uuid) if node else None
        return Bound(
            node=rec.node,
            card_index=first.index,
            uuid=first.uuid,
            model=card.model if card else "unknown",
            units=first.units,
            card_units=card.units if card else 0,
            cards=len(rec.cards),
        )
    a = availability(ledger, demand, pod.node_selector)
    if a.permanent:
        return NeverFits(demand, a)
    ahead = queue_position(pod, queue, demand)
    estimate = history.estimate(demand, ahead, now) if history is not None else None
    return Waiting(demand, a, ahead, estimate)


def render(status: SpawnStatus, unit: str = "GiB") -> str:
    """One line for the spawn-progress page."""
    if isinstance(status, Bound):
        more = f" (and {status.cards - 1} more card(s))" if status.cards > 1 else ""
        size = f" of its {status.card_units} {unit}" if status.card_units else ""
        return (
            f"Your GPU: node {status.node}, card {status.card_index} ({status.model}, {status.uuid}){more}: "
            f"{status.units} {unit}{size}"
        )
    d = status.demand
    a = status.availability
    models = "/".join(d.models) or "GPU"
    if isinstance(status, NeverFits):
        if not a.largest_card:
            return f"This server can never start here: the cluster has no {models} card."
        return (
            f"This server can never start here: it asks {d.describe()}, and the largest {models} card "
            f"holds {a.largest_card} {unit}."
        )
    if d.whole:
        what = f"waiting for {d.count} entirely free {models} card{'s' if d.count > 1 else ''}"
        why = (
            "every card is at least partly in use"
            if a.free == 0
            else "a card is free; the scheduler is on it"
        )
    else:
        what = f"waiting for a {models} with {d.per_card} {unit} free"
        largest = max(a.largest_free.values(), default=0)
        why = (
            f"every card has less (the largest free block is {largest} {unit})"
            if a.free == 0
            else "a card has room; the scheduler is placing the server"
        )
    queue = ""
    if status.ahead:
        queue = (
            f"; {status.ahead} spawn{'s' if status.ahead > 1 else ''} of this size or larger "
            f"{'are' if status.ahead > 1 else 'is'} ahead of you"
        )
    if status.estimate is not None:
        queue += f"; {status.estimate.words()}"
    return f"{what[0].upper()}{what[1:]}: {why}{queue}."
