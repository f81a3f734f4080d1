"""Capacity planning from the hub's own history: what if the hub had had ``N`` cards, and offered
these slice sizes? Pure; the replayer (``gpushare-replay --history``) and the hub service's
planning view (``api/v1/planning``) both run it.

A *session* is one row of the history (:mod:`~gpushare_hub.core.history`): a user asked for a
slice at ``arrive`` (the pod's creation) and held it ``hold`` seconds. The what-if replays those
arrivals against a declared cluster with a policy, the same :class:`~gpushare_hub.core.policy.Placer`
the extender runs. A spawn that finds no room waits, as its pod would stay Pending: each time a
slice is released, the waiting spawns are tried again in the order they came (any that fits
goes, as kube-scheduler places whatever pending pod fits), and each holds its slice for the
seconds it held it in the history, from the moment it is placed.

Sizes are GiB of a card (the catalogue's unit): a card of ``mib`` MiB offers ``mib // 1024``.
With a catalogue, each session gets the smallest offered size that holds what it held, or a
whole card above the largest, as the spawn page would have offered it.

With a :class:`~gpushare_hub.core.hibernation_whatif.Hibernation`, idle sessions hibernate and
cards are overcommitted, as that module models it; the replay is otherwise the same.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .budget import Held
from .cards import Card, Node
from .demand import Demand
from .digits import ascii_digits, ascii_int
from .durations import duration_words
from .errors import GPUShareError
from .fragmentation import Shape
from .hibernation_whatif import Cards, Hibernation
from .history import WAITED_AFTER
from .ledger import Ledger
from .policy import Placer, Policy
from .resources import ResourceNames
from .targets import make_policy_for

# What a plan may ask for at most (a sweep runs every combination; the service computes it
# on request, so an admin's query must not occupy it for long).
MAX_SESSIONS = 200_000
MAX_CARDS = 4096
MAX_GIB = 1024.0


class PlanningError(GPUShareError, ValueError):
    """A history or a plan that cannot be replayed as it is; the message names what and where."""


@dataclass(frozen=True)
class Session:
    """One slice held, as the what-if sees it."""

    arrive: float  # Unix seconds the spawn asked (the pod's creation; else its start)
    hold: float  # seconds it held the slice
    gib: float  # GiB it held (a whole card: the card's GiB)
    model: str = ""
    user: str = ""
    wait: float | None = None  # seconds it waited in the hub (None: not recorded)
    idle: float | None = None  # seconds its notebook left the GPU idle (None: not measured)


# ---- reading the history's rows -------------------------------------------------------------------
def read_time(raw: Any, where: str, column: str) -> float | None:
    """An RFC 3339 time with its zone (the history's times) as Unix seconds; None when empty."""
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str):
        raise PlanningError(f"{where}, {column}: {raw!r} is not a time; write e.g. 2026-11-01T08:00:00Z")
    try:
        when = datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    except ValueError:
        raise PlanningError(
            f"{where}, {column}: {raw[:40]!r} is not a time; write e.g. 2026-11-01T08:00:00Z"
        ) from None
    if when.tzinfo is None:
        raise PlanningError(f"{where}, {column}: {raw[:40]!r} has no time zone; end it with Z (UTC)")
    return when.timestamp()


def _number(raw: Any, where: str, column: str, *, low: float, high: float, what: str) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        value = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not low <= value <= high:  # NaN fails this too
        raise PlanningError(f"{where}, {column}: {str(raw)[:40]!r} is not {what}")
    return value


def session_of(row: Mapping[str, Any], where: str, now: float) -> Session:
    """One history row (``api/v1/history``'s keys; CSV cells as text) as a session. ``where``
    names the row in errors (``history.csv: row 3``); ``now``: the end of a slice still held."""
    if not isinstance(row, Mapping):
        raise PlanningError(f"{where}: not an object with the history's keys (start, end, gib, ...)")
    start = read_time(row.get("start"), where, "start")
    if start is None:
        raise PlanningError(f"{where}, start: missing; every row needs the time its slice was placed")
    end = read_time(row.get("end"), where, "end")
    end = max(now, start) if end is None else end
    if end < start:
        raise PlanningError(f"{where}, end: before start; a slice is released after it is placed")
    gib = _number(
        row.get("gib"),
        where,
        "gib",
        low=1e-9,
        high=MAX_GIB,
        what=f"a GiB amount above 0, at most {MAX_GIB:g}",
    )
    if gib is None:
        raise PlanningError(f"{where}, gib: missing; every row needs the GiB of its slice")
    created = read_time(row.get("created"), where, "created")
    arrive = start if created is None else min(created, start)
    seconds = "a number of seconds, 0 or more"
    idle = _number(row.get("idle_seconds"), where, "idle_seconds", low=0, high=math.inf, what=seconds)
    wait = _number(row.get("wait_seconds"), where, "wait_seconds", low=0, high=math.inf, what=seconds)
    model, user = row.get("model"), row.get("user")
    return Session(
        arrive=arrive,
        hold=end - start,
        gib=gib,
        model=model if isinstance(model, str) else "",
        user=user if isinstance(user, str) else "",
        wait=wait,
        idle=None if idle is None else min(idle, end - start),
    )


def sessions_from_held(held: Iterable[Held], now: float) -> list[Session]:
    """The book's intervals (:class:`~gpushare_hub.core.budget.Held`) as sessions, oldest first,
    read as :func:`session_of` reads the export's rows; a slice still held ends ``now``."""
    out = []
    for h in held:
        if h.gib <= 0:
            continue
        hold = max(0.0, (now if h.end is None else h.end) - h.start)
        out.append(
            Session(
                arrive=h.start if h.created is None else min(h.created, h.start),
                hold=hold,
                gib=h.gib,
                model=h.model,
                wait=None if h.created is None else max(0.0, h.start - h.created),
                idle=None if h.idle_seconds is None else min(h.idle_seconds, hold),
            )
        )
    return sorted(out, key=lambda s: s.arrive)


def sessions_of(rows: Iterable[Mapping[str, Any]], where: Callable[[int], str], now: float) -> list[Session]:
    """Every row as a session (``where(i)`` names row ``i`` in errors), oldest first."""
    out = []
    for i, row in enumerate(rows):
        if i >= MAX_SESSIONS:
            raise PlanningError(
                f"the history has more than {MAX_SESSIONS:,} rows; export a shorter range (since, until)"
            )
        out.append(session_of(row, where(i), now))
    if not out:
        raise PlanningError("the history has no rows: nothing was held in that range")
    return sorted(out, key=lambda s: s.arrive)


# ---- the cluster and the sizes ------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """One what-if: ``cards`` cards of ``model`` (``mib`` each), ``per_node`` to a node, the
    slice sizes offered (GiB; empty: each session its own GiB, rounded up) and a policy."""

    cards: int
    model: str = "Tesla-T4"
    mib: int = 15360
    per_node: int = 1
    catalogue: tuple[int, ...] = ()
    policy: str = "binpack"

    def __post_init__(self) -> None:
        if not 1 <= self.cards <= MAX_CARDS:
            raise PlanningError(f"cards: {self.cards} is not from 1 to {MAX_CARDS}")
        if not 1 <= self.per_node <= 64:
            raise PlanningError(f"cards per node: {self.per_node} is not from 1 to 64")
        if self.mib < 1024:
            raise PlanningError(f"card memory: {self.mib} MiB is less than 1 GiB")
        too_big = [s for s in self.catalogue if not 0 < s <= self.card_gib]
        if too_big:
            raise PlanningError(
                f"catalogue: {too_big[0]} GiB is not a slice of a {self.model} card "
                f"({self.card_gib} GiB); offer sizes from 1 to {self.card_gib}"
            )

    @property
    def card_gib(self) -> int:
        return self.mib // 1024

    def size(self, gib: float) -> int | None:
        """The GiB a session of ``gib`` asks here (the card's GiB: a whole card); None: more
        than a card holds."""
        exact = max(1, math.ceil(gib - 1e-9))
        if exact > self.card_gib:
            return None
        if not self.catalogue:
            return exact
        return next((s for s in sorted(self.catalogue) if s >= exact), self.card_gib)

    def ledger(self, units: int | None = None) -> Ledger:
        """The declared cards, each offering ``units`` (default: its GiB)."""
        ledger = Ledger(ResourceNames(unit="GiB"))
        units = units or self.card_gib
        left, n = self.cards, 0
        while left > 0:
            count = min(self.per_node, left)
            name = f"node-{n:04d}"
            cards = tuple(
                Card(index=i, uuid=f"GPU-{name}-{i}", model=self.model, units=units, mib=self.mib)
                for i in range(count)
            )
            ledger.set_node(Node(name=name, cards=cards))
            left -= count
            n += 1
        return ledger


def parse_catalogue(spec: str, unit: str = "GiB") -> tuple[int, ...]:
    """``"3,5,7"`` -> (3, 5, 7): whole sizes (GiB, or slices of a card), each once, ascending."""
    sizes = []
    for part in spec.split(","):
        text = part.strip()
        size = ascii_int(text, len(str(int(MAX_GIB))))
        if size is None or not 0 < size <= MAX_GIB:
            raise PlanningError(
                f"catalogue: cannot read {text[:20]!r} in {spec[:60]!r}; write positive whole {unit} "
                f"sizes up to {MAX_GIB:g} separated by commas, e.g. 3,5,7"
            )
        sizes.append(size)
    if len(set(sizes)) != len(sizes):
        raise PlanningError(f"catalogue: {spec[:60]!r} names a size twice")
    return tuple(sorted(sizes))


def parse_cards_range(spec: str) -> list[int]:
    """``"4..12"`` (every count from 4 to 12), ``"4,6,8"`` or ``"8"``. Each count is read and
    bounded (ASCII digits, 1 to :data:`MAX_CARDS`) before any list is made."""
    text = spec.strip()
    if ".." in text:
        lo_text, hi_text = text.split("..", 1)
        lo, hi = _card_count(lo_text, text), _card_count(hi_text, text)
        if lo > hi:
            raise PlanningError(
                f"cards: {text[:40]!r} is an empty range; write the smaller count first, e.g. 4..12"
            )
        return list(range(lo, hi + 1))
    return sorted({_card_count(part, text) for part in text.split(",")})


def _card_count(part: str, spec: str) -> int:
    """One count of a ``cards`` query: ASCII digits from 1 to :data:`MAX_CARDS`."""
    text = part.strip()
    if not ascii_digits(text):
        raise PlanningError(
            f"cards: cannot read {spec[:40]!r}; write a range 4..12, a list 4,6,8 or one count"
        )
    count = ascii_int(text, len(str(MAX_CARDS)))
    if count is None or not 1 <= count <= MAX_CARDS:
        shown = text if len(text) <= 12 else f"{text[:12]}... ({len(text)} digits)"
        raise PlanningError(f"cards: {shown} is not from 1 to {MAX_CARDS}")
    return count


# ---- the replay -----------------------------------------------------------------------------------
def make_plan_policy(name: str, demands: Iterable[Demand]) -> Policy:
    """``name``'s policy; fgd, strand and fgd-sim get the sessions' mix of sizes as their target."""
    try:
        return make_policy_for(name, (Shape.of(d) for d in demands))
    except ValueError as err:
        raise PlanningError(str(err)) from None


@dataclass
class Outcome:
    """What happened in one what-if, session by session and over time."""

    plan: Plan
    waits: list[float | None]  # per session: seconds it waited (None: never placed)
    sizes: list[int | None]  # per session: GiB it asked here (None: more than a card)
    peak_cards: int = 0
    peak_lower_bound: int = 0
    card_hours: float = 0.0
    lower_bound_card_hours: float = 0.0
    times: list[float] = field(default_factory=list)
    cards: list[int] = field(default_factory=list)
    bounds: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)


def replay(sessions: Sequence[Session], plan: Plan, hibernation: Hibernation | None = None) -> Outcome:
    """The what-if of module docstring: ``sessions`` against ``plan`` (with ``hibernation``)."""
    held_gib = plan.card_gib if hibernation is None else hibernation.held_gib(plan.card_gib)
    cards = Cards(plan.ledger(held_gib), plan.card_gib, held_gib)
    sizes = [plan.size(s.gib) for s in sessions]
    demands = [None if size is None else cards.demand(f"s{i}", size) for i, size in enumerate(sizes)]
    placer = Placer(cards.ledger, make_plan_policy(plan.policy, (d for d in demands if d is not None)))
    out = Outcome(plan, [None] * len(sessions), sizes)
    events: list[tuple[float, int, int]] = []  # (time, 0 = release / 1 = arrival / 2 = hibernation, session)
    for i, s in enumerate(sessions):
        if sizes[i] is not None:
            events.append((s.arrive, 1, i))
    heapq.heapify(events)
    queues: dict[int, deque[int]] = {}  # the waiting spawns by size, each in the order they came
    waiting_now = 0

    def place_waiting(t: float) -> int:
        """Try the waiting spawns, oldest first, and place any that fits; a size that finds no
        room stops the larger ones too (the what-if's pods ask GPU memory only, so nothing
        larger fits either). Returns how many it placed. Each try costs one head per size,
        however many spawns wait."""
        heads = [(q[0], size) for size, q in queues.items() if q]
        heapq.heapify(heads)
        smallest_refused = math.inf
        placed = 0
        while heads:
            i, size = heapq.heappop(heads)
            if size >= smallest_refused:
                continue
            demand = demands[i]
            assert demand is not None
            placement = placer.place_if_room(demand)
            if placement is None:
                smallest_refused = size
                continue
            queue = queues[size]
            queue.popleft()
            placed += 1
            out.waits[i] = t - sessions[i].arrive
            cards.placed(placement, size)
            hold = sessions[i].hold
            heapq.heappush(events, (t + hold, 0, i))
            if hibernation is not None:
                asleep = t + hibernation.awake_for(hold, sessions[i].idle)
                if asleep < t + hold:
                    heapq.heappush(events, (asleep, 2, i))
            if queue:
                heapq.heappush(heads, (queue[0], size))
        return placed

    last_t: float | None = None
    cards_now = bound_now = 0
    while events:
        t = events[0][0]
        if last_t is not None:
            out.card_hours += cards_now * (t - last_t) / 3600
            out.lower_bound_card_hours += bound_now * (t - last_t) / 3600
        while events and events[0][0] == t:
            _, kind, i = heapq.heappop(events)
            size = sizes[i]
            assert size is not None
            if kind == 0:
                cards.release(f"s{i}")
            elif kind == 2:
                cards.hibernate(f"s{i}")
            else:
                queues.setdefault(size, deque()).append(i)
                waiting_now += 1
        waiting_now -= place_waiting(t)
        cards_now = cards.in_use()
        bound_now = cards.bound()
        out.peak_cards = max(out.peak_cards, cards_now)
        out.peak_lower_bound = max(out.peak_lower_bound, bound_now)
        out.times.append(t)
        out.cards.append(cards_now)
        out.bounds.append(bound_now)
        out.waiting.append(waiting_now)
        last_t = t
    return out


# ---- the figures ----------------------------------------------------------------------------------
def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank percentile (a value that occurred); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def figures(sessions: Sequence[Session], out: Outcome) -> dict[str, Any]:
    """One what-if's figures; the keys are a contract (``gpushare-replay --json``, the dashboard)."""
    plan = out.plan
    waited = [w for w in out.waits if w is not None and w > 0]
    placed = [i for i, w in enumerate(out.waits) if w is not None]
    asked = sum((out.sizes[i] or 0) * sessions[i].hold for i in placed) / 3600
    measured = [i for i in placed if sessions[i].idle is not None]
    idle = sum((out.sizes[i] or 0) * (sessions[i].idle or 0.0) for i in measured) / 3600
    spawns = len(sessions)
    median, p95 = percentile(waited, 50), percentile(waited, 95)
    return {
        "cards": plan.cards,
        "model": plan.model,
        "cards_per_node": plan.per_node,
        "catalogue": list(plan.catalogue),
        "policy": plan.policy,
        "spawns": spawns,
        "waited": len(waited),
        "waited_pct": round(100 * len(waited) / spawns, 2) if spawns else 0.0,
        "wait_median_seconds": None if median is None else round(median, 1),
        "wait_p95_seconds": None if p95 is None else round(p95, 1),
        "never_fits": sum(1 for s in out.sizes if s is None),
        "peak_cards": out.peak_cards,
        "peak_lower_bound": out.peak_lower_bound,
        "card_hours": round(out.card_hours, 2),
        "lower_bound_card_hours": round(out.lower_bound_card_hours, 2),
        "asked_gib_hours": round(asked, 2),
        "idle_gib_hours": round(idle, 2) if measured else None,
        "idle_measured_sessions": len(measured),
    }


def recorded(sessions: Sequence[Session]) -> dict[str, Any]:
    """What the history itself says (the hub as it was): spawns, how many waited (more than
    :data:`~gpushare_hub.core.history.WAITED_AFTER` seconds, as the export counts) and how long,
    the peak GiB held at once."""
    waits = [s.wait for s in sessions if s.wait is not None]
    waited = [w for w in waits if w > WAITED_AFTER]  # the hub's bind takes a second or two
    points = sorted(
        [(s.arrive + (s.wait or 0.0), s.gib) for s in sessions]
        + [(s.arrive + (s.wait or 0.0) + s.hold, -s.gib) for s in sessions],
        key=lambda p: (p[0], p[1]),
    )
    held = peak = 0.0
    for _, gib in points:
        held += gib
        peak = max(peak, held)
    median, p95 = percentile(waited, 50), percentile(waited, 95)
    return {
        "spawns": len(sessions),
        "first": iso(min(s.arrive for s in sessions)) if sessions else None,
        "last": iso(max(s.arrive for s in sessions)) if sessions else None,
        "wait_recorded": len(waits),
        "waited": len(waited),
        "wait_median_seconds": None if median is None else round(median, 1),
        "wait_p95_seconds": None if p95 is None else round(p95, 1),
        "peak_gib_held": round(peak, 2),
    }


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def wait_words(seconds: float | None) -> str:
    """A wait in the planner's tables (:func:`~.durations.duration_words`); a dash for none."""
    return "-" if seconds is None else duration_words(seconds)


def row_words(row: Mapping[str, Any]) -> str:
    """One what-if in a sentence: ``8 cards: 2.0% of spawns wait, p95 40 s``."""
    if not row["waited"]:
        wait = "no spawn waits"
    else:
        wait = (
            f"{row['waited_pct']}% of spawns wait, median {wait_words(row['wait_median_seconds'])}, "
            f"p95 {wait_words(row['wait_p95_seconds'])}"
        )
    return f"{row['cards']} card{'' if row['cards'] == 1 else 's'}: {wait}"


def sweep(
    sessions: Sequence[Session],
    plans: Sequence[Plan],
    progress: Callable[[int, int, Plan], None] | None = None,
) -> list[dict[str, Any]]:
    """Every plan's figures, in order; ``progress(done, total, plan)`` after each."""
    rows = []
    for n, plan in enumerate(plans, start=1):
        rows.append(figures(sessions, replay(sessions, plan)))
        if progress is not None:
            progress(n, len(plans), plan)
    return rows
