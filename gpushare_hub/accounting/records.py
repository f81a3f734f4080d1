"""The book's second room: what admins added to budgets, and what the service did about a spent
budget or an idle slice (warned, notified, stopped, parked), with the Keep presses that put an
idle slice's return off. One row per thing done, so that a restarted service never warns twice,
stops a server twice, or forgets a Keep.

Budgets are recorded per user and window (its start, Unix seconds); idle slices per user,
server and idle *stretch* (see :mod:`gpushare_hub.service.idle`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from .sqlitefile import Tables


@dataclass(frozen=True)
class IdleAction:
    """One thing done about an idle stretch: ``warned``, ``notified``, ``stopped`` or ``parked``."""

    user: str
    server: str
    stretch: str
    what: str
    slice: str
    units: int
    at: int
    idle_seconds: int
    detail: str = ""


class Records(Tables):
    """Additions, actions and Keep presses (module docstring)."""

    # ---- what admins added to a budget ----------------------------------------------------------
    def add(
        self, user: str, window_start: float, gib_hours: float, by: str, now: float | None = None
    ) -> float:
        """Add ``gib_hours`` to ``user``'s window; returns all that was added to it."""
        with self._lock:
            self._db.execute(
                "INSERT INTO budget_added VALUES (?, ?, ?, ?, ?)",
                (user, window_start, gib_hours, by, time.time() if now is None else now),
            )
        return self.added(user, window_start)

    def added(self, user: str, window_start: float) -> float:
        with self._lock:
            (total,) = self._db.execute(
                "SELECT COALESCE(SUM(gib_hours), 0) FROM budget_added WHERE user = ? AND window_start = ?",
                (user, window_start),
            ).fetchone()
        return float(total)

    def added_by_user(self, window_start: float) -> dict[str, float]:
        with self._lock:
            rows = self._db.execute(
                "SELECT user, SUM(gib_hours) FROM budget_added WHERE window_start = ? GROUP BY user",
                (window_start,),
            ).fetchall()
        return {user: float(total) for user, total in rows}

    # ---- what was done about a spent budget -----------------------------------------------------
    def record_budget(self, user: str, window_start: float, what: str, at: float, detail: str = "") -> bool:
        """Record ``warned`` or ``returned`` for ``user``'s window; False when already recorded."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO budget_actions VALUES (?, ?, ?, ?, ?)",
                (user, window_start, what, at, detail),
            )
            return cur.rowcount == 1

    def budget_done(self, user: str, window_start: float) -> dict[str, float]:
        """What was done about ``user``'s spent window, with when."""
        with self._lock:
            rows = self._db.execute(
                "SELECT what, at FROM budget_actions WHERE user = ? AND window_start = ?",
                (user, window_start),
            ).fetchall()
        return {what: at for what, at in rows}

    def forget_budget(self, what: str, user: str, window_start: float) -> None:
        with self._lock:
            self._db.execute(
                "DELETE FROM budget_actions WHERE user = ? AND window_start = ? AND what = ?",
                (user, window_start, what),
            )

    # ---- Keep, and what was done about an idle stretch ------------------------------------------
    def keep(self, user: str, server: str, stretch: str, until: int, now: int | None = None) -> bool:
        """Record a Keep for the stretch; False when it was already kept once."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO keeps VALUES (?, ?, ?, ?, ?)",
                (user, server, stretch, until, int(time.time() if now is None else now)),
            )
            return cur.rowcount == 1

    def keeps(self, users: Iterable[str]) -> dict[tuple[str, str, str], int]:
        """The Keep presses of ``users`` (only theirs are read: the primary key's first column)."""
        rows = []
        with self._lock:
            for user in sorted(set(users)):
                rows += self._db.execute(
                    "SELECT user, server, stretch, until FROM keeps WHERE user = ?", (user,)
                ).fetchall()
        return {(u, s, st): until for u, s, st, until in rows}

    def record_idle(self, action: IdleAction) -> bool:
        """Record an action; False when the same action was already recorded for the stretch."""
        a = action
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO idle_actions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (a.user, a.server, a.stretch, a.what, a.slice, a.units, a.at, a.idle_seconds, a.detail),
            )
            return cur.rowcount == 1

    def idle_done(self, user: str, server: str, stretch: str) -> set[str]:
        """What was already done about the stretch."""
        with self._lock:
            rows = self._db.execute(
                "SELECT what FROM idle_actions WHERE user = ? AND server = ? AND stretch = ?",
                (user, server, stretch),
            ).fetchall()
        return {w for (w,) in rows}

    def returned(self, user: str, since: int) -> list[IdleAction]:
        """The user's slices stopped or parked since ``since`` (Unix seconds), newest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT user, server, stretch, what, slice, units, at, idle_seconds, detail "
                "FROM idle_actions WHERE user = ? AND at >= ? AND what IN ('stopped', 'parked') "
                "ORDER BY at DESC",
                (user, since),
            ).fetchall()
        return [IdleAction(*row) for row in rows]
