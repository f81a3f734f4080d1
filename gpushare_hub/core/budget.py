"""GiB-hour budgets: how much GPU memory, times how long, a hub user held within a window.

A slice of ``g`` GiB held for ``h`` hours costs ``g × h`` GiB·h, whether or not its GPU was
busy. A budget covers a calendar window (a day, a week from Monday, a month), in one time zone
so that "this week" ends when the users' week ends; a held slice that spans two windows costs
each window its own part. The limit is the user's (``quota_gib_hours``) or the largest of their
groups' (``quota_gib_hours_per_group``), as for the GiB quota; an admin may add to one user's
current window.

Held intervals come from the API server's own record (the pod's placement to its deletion),
kept by the hub service; this module only counts. Times are Unix seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, tzinfo

WINDOWS = ("day", "week", "month")
_WINDOW_WORDS = {"day": "today", "week": "this week", "month": "this month"}


def window_bounds(now: float, window: str, tz: tzinfo) -> tuple[float, float]:
    """The start and end (Unix seconds) of the ``window`` holding ``now``, in time zone ``tz``:
    midnight to midnight, Monday to Monday, the 1st to the 1st (a day across a daylight-saving
    change is 23 or 25 hours long)."""
    if window not in WINDOWS:
        raise ValueError(f"unknown budget window {window!r}: use one of {', '.join(WINDOWS)}")
    local = datetime.fromtimestamp(now, tz)
    day = local.replace(hour=0, minute=0, second=0, microsecond=0, fold=0)
    if window == "day":
        start, end = day, day + timedelta(days=1)
    elif window == "week":
        start = day - timedelta(days=day.weekday())
        end = start + timedelta(days=7)
    else:
        start = day.replace(day=1)
        end = (
            start.replace(year=start.year + 1, month=1)
            if start.month == 12
            else start.replace(month=start.month + 1)
        )
    # Wall-clock arithmetic in the zone, then re-localised: midnight stays midnight across DST.
    return _epoch(start, tz), _epoch(end, tz)


def _epoch(wall: datetime, tz: tzinfo) -> float:
    return datetime(wall.year, wall.month, wall.day, tzinfo=tz).timestamp()


@dataclass(frozen=True)
class Held:
    """One slice held by a hub user: ``gib`` GiB from ``start`` until ``end`` (None: still held)."""

    key: str
    user: str
    gib: float
    start: float
    end: float | None = None
    server: str = ""
    # For the hub's history (capacity planning), not the budgets: the catalogue slice, the card
    # model, when the pod was made (the spawn waited ``start - created``), the user's groups.
    slice: str = ""
    model: str = ""
    created: float | None = None
    groups: tuple[str, ...] = ()
    # GPU use, for the history's idle GiB-hours: the seconds its notebook left the GPU idle
    # (None: never measured), and, in one look at what is held, whether its node measures use
    # and since when the notebook has been idle on the GPU (None: busy or not measured).
    idle_seconds: float | None = None
    measured: bool = False
    idle_since: float | None = None


def gib_hours(held: Iterable[Held], start: float, end: float, now: float) -> float:
    """GiB·h the intervals cost within ``[start, end)``; a slice still held counts up to ``now``."""
    total = 0.0
    for h in held:
        stop = min(now if h.end is None else h.end, end)
        begin = max(h.start, start)
        if stop > begin:
            total += h.gib * (stop - begin) / 3600
    return total


def limit_for(per_user: float | None, per_group: Mapping[str, float], groups: Iterable[str]) -> float | None:
    """The user's GiB·h budget: the largest among their groups' overrides, else the per-user one
    (None: no budget)."""
    overrides = [per_group[g] for g in groups if g in per_group]
    return max(overrides) if overrides else per_user


def number(value: float) -> str:
    """GiB·h as people read them: whole numbers from 10, one decimal below, two below 1."""
    if abs(value) < 0.005:
        return "0"
    if abs(value) >= 10:
        return str(round(value))
    text = f"{value:.2f}" if abs(value) < 1 else f"{value:.1f}"
    return text.rstrip("0").rstrip(".") or "0"


@dataclass(frozen=True)
class Budget:
    """One user's budget in the current window."""

    window: str
    start: float
    end: float
    limit: float
    used: float
    added: float = 0.0

    @property
    def total(self) -> float:
        return self.limit + self.added

    @property
    def left(self) -> float:
        return self.total - self.used

    @property
    def spent(self) -> bool:
        return self.left <= 0

    def hours_left(self, gib: float) -> float:
        """How long a slice of ``gib`` GiB may still be held in this window (0 when spent)."""
        return max(self.left, 0.0) / gib if gib > 0 else math.inf

    def used_words(self) -> str:
        """``"38 of 100 GiB·h used this week"`` (with what an admin added, when they did)."""
        added = f" (with {number(self.added)} added)" if self.added else ""
        return f"{number(self.used)} of {number(self.total)} GiB·h{added} used {_WINDOW_WORDS[self.window]}"

    def document(self, tz: tzinfo) -> dict[str, object]:
        """``api/v1/me``'s ``budget``."""
        return {
            "window": self.window,
            "window_start": iso(self.start, tz),
            "resets_at": iso(self.end, tz),
            "limit_gib_hours": round(self.limit, 3),
            "added_gib_hours": round(self.added, 3),
            "used_gib_hours": round(self.used, 3),
            "left_gib_hours": round(max(self.left, 0.0), 3),
            "spent": self.spent,
        }


def iso(seconds: float, tz: tzinfo) -> str:
    return datetime.fromtimestamp(seconds, tz).isoformat(timespec="seconds")


def reset_words(seconds: float, tz: tzinfo) -> str:
    """``"Monday 30 November 00:00 UTC"``: when a window ends, as the form and messages say it."""
    when = datetime.fromtimestamp(seconds, tz)
    return f"{when:%A} {when.day} {when:%B %H:%M} {when.tzname()}"


def hours_words(hours: float) -> str:
    """``"12 min"``, ``"3.5 h"``: how long, for people."""
    if hours < 1:
        return f"{max(1, round(hours * 60))} min"
    return f"{number(hours)} h"


def spend_line(budget: Budget, slice_words: str, gib: float, hours: float) -> str:
    """The spawn form's line: ``"38 of 100 GiB·h used this week; a 5 GiB slice for 8 h would
    use 40"``, and how long the slice may run when that is more than is left."""
    line = f"{budget.used_words()}; {slice_words} for {number(hours)} h would use {number(gib * hours)}"
    if 0 < budget.left < gib * hours:
        line += f" ({number(budget.left)} left: about {hours_words(budget.hours_left(gib))} of it)"
    return line


def refusal(budget: Budget, tz: tzinfo) -> str:
    """Why a spawn with the budget spent is refused, and what the user can do."""
    return (
        f"your GPU budget is spent: {budget.used_words()}. It resets {reset_words(budget.end, tz)}; "
        "until then choose a profile without a GPU, or ask an admin to add GiB·h"
    )


# ---- a running server once the budget is spent ----------------------------------------------
NOTIFY, STOP, PARK = "notify", "stop", "park"
BUDGET_ACTIONS = (NOTIFY, STOP, PARK)


@dataclass(frozen=True)
class Overrun:
    """A user holding slices with the budget spent: warned at ``warned_at`` (None: not yet),
    acted on from ``due_at``."""

    user: str
    budget: Budget
    warned_at: float | None
    grace: float

    @property
    def due_at(self) -> float | None:
        return None if self.warned_at is None else self.warned_at + self.grace

    def phase(self, now: float) -> str:
        """``warn`` (nobody told the user yet), ``warned`` (within the grace), ``due``."""
        if self.warned_at is None:
            return "warn"
        return "due" if now >= self.warned_at + self.grace else "warned"
