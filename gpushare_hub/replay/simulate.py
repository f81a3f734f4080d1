"""The two replays: dynamic (arrivals and departures) and static (FGD-style fill-up).

Both drive the same :class:`~gpushare_hub.core.policy.Placer` the extender uses.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from ..core.bounds import l2
from ..core.demand import Demand
from ..core.ledger import Ledger, Placement
from ..core.policy import Placer, Refusal
from ..core.verdict import Kind, Reason
from .cluster import Units
from .trace import TraceError, TracePod


@dataclass
class Failures:
    """Pods that could not be placed, by reason category, with an example of each."""

    count: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, refusal: Refusal) -> None:
        self.count += 1
        kind = "never fits" if refusal.permanent else "no room now"
        waiting = (v.reason for v in refusal.verdicts.values() if v.kind is Kind.NOT_NOW)
        if refusal.nodes and all(reason in (Reason.CPU, Reason.MEMORY) for reason in waiting):
            kind = "no node has the CPU or host memory"
        self.by_kind[kind] += 1
        self.examples.setdefault(kind, refusal.reason)

    def as_json(self) -> dict[str, object]:
        return {"count": self.count, "by_reason": dict(self.by_kind), "examples": self.examples}


def select(pods: list[TracePod], which: str) -> list[TracePod]:
    if which == "sharing":
        return [p for p in pods if p.sharing]
    if which == "gpu":
        return [p for p in pods if p.num_gpu > 0]
    return list(pods)


@dataclass
class DynamicResult:
    pods: int
    placed: int
    skipped: int
    failures: Failures
    peak_cards: int
    peak_lower_bound: int
    card_hours: float
    lower_bound_hours: float
    times: list[float]
    cards: list[int]
    bounds: list[int]
    held_unit_hours: float = 0.0
    asked_unit_hours: float = 0.0

    @property
    def peak_ratio(self) -> float:
        return self.peak_cards / self.peak_lower_bound if self.peak_lower_bound else float("nan")

    @property
    def card_hours_ratio(self) -> float:
        return self.card_hours / self.lower_bound_hours if self.lower_bound_hours else float("nan")


def run_dynamic(
    pods: list[TracePod], ledger: Ledger, units: Units, placer: Placer, compress: float, source: str
) -> DynamicResult:
    """Replay arrivals (creation / compress) and departures (each pod's own duration)."""
    if compress <= 0:
        raise TraceError(f"--compress must be positive, got {compress}")
    events: list[tuple[float, int, int]] = []  # (time, 0=leave / 1=arrive, pod index)
    skipped = 0
    for i, p in enumerate(pods):
        if p.creation is None or p.deletion is None:
            raise TraceError(
                f"{source}: row {i + 2}: dynamic mode needs creation_time and deletion_time "
                "(this file has none); use --mode static"
            )
        if p.deletion <= p.creation:
            skipped += 1
            continue
        start = p.creation / compress
        events.append((start, 1, i))
        events.append((start + (p.deletion - p.creation), 0, i))
    events.sort()
    capacity = units.per_card
    hist: dict[int, int] = {}
    demands: dict[int, Demand] = {}
    failures = Failures()
    placed = 0
    times: list[float] = []
    cards_t: list[int] = []
    bounds_t: list[int] = []
    peak_cards = peak_bound = 0
    card_hours = bound_hours = held_hours = asked_hours = 0.0
    held = asked = 0  # units held by placed pods now, and what they asked before any catalogue
    last_t: float | None = None
    last_cards = last_bound = 0
    j = 0
    while j < len(events):
        t = events[j][0]
        if last_t is not None:
            card_hours += last_cards * (t - last_t) / 3600
            bound_hours += last_bound * (t - last_t) / 3600
            held_hours += held * (t - last_t) / 3600
            asked_hours += asked * (t - last_t) / 3600
        changed = False
        while j < len(events) and events[j][0] == t:
            _, kind, i = events[j]
            j += 1
            key = pods[i].name
            if kind == 0:
                d = demands.pop(i, None)
                if d is not None:
                    ledger.release(key)
                    size = units.size(d)
                    hist[size] -= d.count
                    held -= size * d.count
                    asked -= units.exact_units(pods[i])
                    changed = True
                continue
            d = units.demand(pods[i], key)
            result = placer.place_and_commit(d)
            if isinstance(result, Placement):
                placed += 1
                demands[i] = d
                size = units.size(d)
                hist[size] = hist.get(size, 0) + d.count
                held += size * d.count
                asked += units.exact_units(pods[i])
                changed = True
            else:
                failures.add(result)
        if changed or last_t is None:
            last_cards = ledger.cards_in_use()
            last_bound = l2(hist, capacity)
        peak_cards = max(peak_cards, last_cards)
        peak_bound = max(peak_bound, last_bound)
        times.append(t)
        cards_t.append(last_cards)
        bounds_t.append(last_bound)
        last_t = t
    return DynamicResult(
        pods=len(pods),
        placed=placed,
        skipped=skipped,
        failures=failures,
        peak_cards=peak_cards,
        peak_lower_bound=peak_bound,
        card_hours=card_hours,
        lower_bound_hours=bound_hours,
        times=times,
        cards=cards_t,
        bounds=bounds_t,
        held_unit_hours=held_hours,
        asked_unit_hours=asked_hours,
    )


@dataclass
class StaticResult:
    seed: int
    pods: int
    unallocated_gpu_pct_at_100: float
    failed_at_100: int
    unallocated_gpu_pct_at_end: float
    failures: Failures
    arrived_pct: list[float]
    allocated_pct: list[float]


def request_units(d: Demand, units: Units) -> int:
    return units.size(d) * d.count if d.count else 0


def inflate_workload(
    pods: list[TracePod], units: Units, capacity: int, inflate: float, rng: random.Random
) -> list[TracePod]:
    """Shuffle, then append copies of random pods until requests reach ``inflate`` x capacity."""
    order = list(pods)
    rng.shuffle(order)
    total = sum(request_units(units.demand(p, p.name), units) for p in order)
    target = inflate * capacity
    n = 0
    while total < target:
        src = rng.choice(pods)
        n += 1
        clone = TracePod(
            name=f"{src.name}-clone{n}",
            cpu_milli=src.cpu_milli,
            memory_mib=src.memory_mib,
            num_gpu=src.num_gpu,
            gpu_milli=src.gpu_milli,
            gpu_spec=src.gpu_spec,
        )
        order.append(clone)
        total += request_units(units.demand(clone, clone.name), units)
    return order


def run_static(
    pods: list[TracePod], ledger: Ledger, units: Units, placer: Placer, seed: int, inflate: float
) -> StaticResult:
    """FGD's experiment: no departures; read the unallocated share when arrivals reach 100%."""
    if inflate < 1:
        raise TraceError(f"--inflate must be at least 1.0 (100% of capacity), got {inflate}")
    _, capacity = ledger.totals()
    if capacity == 0:
        raise TraceError("the cluster has no GPU capacity")
    order = inflate_workload(pods, units, capacity, inflate, random.Random(seed))
    arrived = allocated = 0
    failures = Failures()
    at_100: tuple[float, int] | None = None
    arrived_pct: list[float] = []
    allocated_pct: list[float] = []
    # Nothing leaves in this experiment, so a shape that failed once fails again: its
    # refusal is reused instead of evaluating every node once more.
    failed_shapes: dict[tuple[object, ...], Refusal] = {}
    for p in order:
        d = units.demand(p, p.name)
        req = request_units(d, units)
        arrived += req
        shape = Placer.shape(d)
        result = failed_shapes.get(shape) or placer.place_and_commit(d)
        if isinstance(result, Refusal):
            failed_shapes[shape] = result
        if isinstance(result, Placement):
            allocated += req
        else:
            failures.add(result)
        if req:
            arrived_pct.append(100 * arrived / capacity)
            allocated_pct.append(100 * allocated / capacity)
        if at_100 is None and arrived >= capacity:
            at_100 = (100 - 100 * allocated / capacity, failures.count)
    assert at_100 is not None  # inflate >= 1 guarantees arrivals reach capacity
    return StaticResult(
        seed=seed,
        pods=len(order),
        unallocated_gpu_pct_at_100=at_100[0],
        failed_at_100=at_100[1],
        unallocated_gpu_pct_at_end=100 - 100 * allocated / capacity,
        failures=failures,
        arrived_pct=arrived_pct,
        allocated_pct=allocated_pct,
    )
