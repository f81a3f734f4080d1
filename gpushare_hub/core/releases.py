"""How often slices come free: the recent releases a waiting spawn's estimate is made from. Pure.

A :class:`ReleaseHistory` remembers, for a window (6 h by default), each allocation that ended
(its pod deleted or finished): when, on which card model, how many units per card and on how
many cards. For a waiting demand, :meth:`ReleaseHistory.estimate` counts the releases that would
have made room for it (the same model, at least as many units per card, or as many whole cards)
and turns their rate into an expected wait for the demand's place in the queue:
``(ahead + 1) x span / releases``. It is an estimate, said as one, and there is none without
history (fewer than two such releases, or less than ten minutes watched): a made-up figure is
worse than no figure.

The history lives in memory, beside the watch that sees allocations end; a restarted process
starts with none.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .demand import Demand
from .durations import duration_words

WINDOW_SECONDS = 6 * 3600
MIN_RELEASES = 2
MIN_SPAN_SECONDS = 600


@dataclass(frozen=True, slots=True)
class Release:
    at: float  # seconds (the watcher's clock)
    model: str
    units: int  # per card
    cards: int = 1


@dataclass(frozen=True, slots=True)
class Estimate:
    seconds: int  # the expected wait
    releases: int  # such releases seen in ...
    span: int  # ... this many seconds

    def words(self) -> str:
        n = "1 such slice was" if self.releases == 1 else f"{self.releases} such slices were"
        last = duration_words(self.span)
        return f"estimate: about {duration_words(self.seconds)} ({n} released in the last {last})"

    def to_json(self) -> dict[str, object]:
        return {"seconds": self.seconds, "releases": self.releases, "span": self.span, "words": self.words()}


def _frees_room_for(r: Release, demand: Demand) -> bool:
    if not demand.model_allowed(r.model):
        return False
    if demand.whole:
        return r.cards >= demand.count
    return demand.per_card is not None and r.units >= demand.per_card


class ReleaseHistory:
    def __init__(
        self,
        started: float,
        window: float = WINDOW_SECONDS,
        limit: int = 10_000,
        min_span: float = MIN_SPAN_SECONDS,
    ) -> None:
        """``started``: when watching began (on the same clock as the releases); ``min_span``:
        how long it must have watched before it estimates."""
        self.started = started
        self.window = window
        self.min_span = min_span
        self._items: deque[Release] = deque(maxlen=limit)

    def add(self, release: Release) -> None:
        self._items.append(release)

    def __len__(self) -> int:
        return len(self._items)

    def estimate(self, demand: Demand, ahead: int, now: float) -> Estimate | None:
        """The expected wait of ``demand`` with ``ahead`` such spawns before it; None without history."""
        since = max(self.started, now - self.window)
        span = now - since
        n = sum(1 for r in self._items if since <= r.at <= now and _frees_room_for(r, demand))
        if n < MIN_RELEASES or span < self.min_span:
            return None
        return Estimate(seconds=int((ahead + 1) * span / n), releases=n, span=int(span))
