"""The book's first room: every slice a hub user held, as intervals (one per pod placement).

The hub service is the only writer: every pass it records the slices the API server says are
held (:meth:`Intervals.observe`), so an interval's start is the pod's placement and its end the
pass that no longer saw it. The GiB·h budgets, the history and the planner read them.

A restart loses at most the time the service was down: an interval still open in the file
whose pod is gone when the service next looks ends when it was last seen, not at the restart.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from gpushare_hub.core.budget import Held, gib_hours

from .sqlitefile import Tables

COLUMNS = 'key, user, gib, start, "end", server, slice, model, created, groups, idle_seconds'


def _held(row: Sequence[Any]) -> Held:
    """A row of COLUMNS as the interval it records."""
    key, user, gib, start, end, server, slice_, model, created, groups, idle = row
    try:
        names = json.loads(groups)
    except ValueError:
        names = []
    group_names = tuple(str(g) for g in names) if isinstance(names, list) else ()
    return Held(key, user, gib, start, end, server, slice_, model, created, group_names, idle)


def idle_between(seen: float, now: float, idle_since: float | None) -> float:
    """Seconds of ``(seen, now]`` a notebook idle on the GPU since ``idle_since`` (None: busy)
    spent idle."""
    if idle_since is None:
        return 0.0
    return max(0.0, now - max(seen, idle_since))


def pod_of(key: str) -> str:
    """The pod of an interval's key, ``<namespace>/<pod>@<start>``."""
    return key.rpartition("@")[0] or key


class Intervals(Tables):
    """What was held, and what it cost (module docstring)."""

    # ---- what is held -------------------------------------------------------------------------
    def observe(self, held: Iterable[Held], now: float, gap: float) -> list[Held]:
        """Record one look at what is held now; returns the intervals it closed.

        Each of ``held`` is opened (at its own start) or marked seen; a closed one is opened
        again (a pass missed it). An open interval not among them ended: ``now`` when the last
        look was at most ``gap`` seconds ago, else when it was last seen (the service was down
        in between and cannot tell when it went).
        """
        current = {h.key: h for h in held}
        by_pod = {pod_of(h.key): h.key for h in held}
        closed: list[Held] = []
        last: dict[str, tuple[float, float | None]] = {}  # open interval -> (seen, idle seconds)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = self._db.execute(f'SELECT {COLUMNS}, seen FROM held WHERE "end" IS NULL').fetchall()
                for *row, seen in rows:
                    old = _held(row)
                    key, user, start = old.key, old.user, old.start
                    last[key] = (seen, old.idle_seconds)
                    if key in current:
                        continue
                    renamed = by_pod.get(pod_of(key))
                    if renamed is not None and renamed in current and current[renamed].user == user:
                        # The same pod under another start (its start time was read later):
                        # one placement, kept under the key it was first seen with.
                        current[key] = current.pop(renamed)
                        continue
                    end = now if now - seen <= gap else seen
                    end = max(end, start)
                    self._db.execute('UPDATE held SET "end" = ? WHERE key = ?', (end, key))
                    closed.append(replace(old, end=end))
                for key, h in current.items():
                    # A placement seen again after a pass that missed it (a relist) was held all
                    # along: its interval is opened again.
                    seen, idle = last.get(key, (min(h.start, now), None))
                    if h.measured:
                        idle = (idle or 0.0) + idle_between(seen, now, h.idle_since)
                    self._db.execute(
                        "INSERT INTO held (key, user, server, gib, start, seen, slice, model, created, "
                        "groups, idle_seconds) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                        'ON CONFLICT (key) DO UPDATE SET seen = excluded.seen, "end" = NULL, '
                        "idle_seconds = COALESCE(excluded.idle_seconds, held.idle_seconds)",
                        (
                            key,
                            h.user,
                            h.server,
                            h.gib,
                            min(h.start, now),
                            now,
                            h.slice,
                            h.model,
                            h.created,
                            json.dumps(sorted(h.groups)),
                            idle,
                        ),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return closed

    def intervals(self, start: float, end: float, user: str | None = None) -> list[Held]:
        """Every interval that overlaps ``[start, end)`` (one user's, or everyone's)."""
        query = f'SELECT {COLUMNS} FROM held WHERE start < ? AND ("end" IS NULL OR "end" > ?)'

        args: tuple[object, ...] = (end, start)
        if user is not None:
            query += " AND user = ?"
            args += (user,)
        query += " ORDER BY start, key"
        with self._lock:
            rows = self._db.execute(query, args).fetchall()
        return [_held(row) for row in rows]

    def used(self, user: str, start: float, end: float, now: float) -> float:
        """GiB·h ``user`` held within ``[start, end)``, open intervals counted up to ``now``."""
        return gib_hours(self.intervals(start, end, user), start, end, now)

    def used_by_user(self, start: float, end: float, now: float) -> dict[str, float]:
        by_user: dict[str, list[Held]] = {}
        for h in self.intervals(start, end):
            by_user.setdefault(h.user, []).append(h)
        return {user: gib_hours(held, start, end, now) for user, held in by_user.items()}
