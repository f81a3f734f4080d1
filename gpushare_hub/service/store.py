"""The service's own small database: Keep presses, and what was done to idle slices.

A SQLite file beside the hub's own database (``GPUShareService.state_db``; in Zero to
JupyterHub the hub's volume), so a restart of the service or the hub loses neither a Keep nor
the record that a stretch was already acted on (no slice is stopped twice, no warning repeated).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpushare_hub.accounting.sqlitefile import connect_private

SCHEMA = """
CREATE TABLE IF NOT EXISTS keeps (
    user TEXT NOT NULL, server TEXT NOT NULL, stretch TEXT NOT NULL, until INTEGER NOT NULL,
    pressed INTEGER NOT NULL, PRIMARY KEY (user, server, stretch));
CREATE TABLE IF NOT EXISTS idle_actions (
    user TEXT NOT NULL, server TEXT NOT NULL, stretch TEXT NOT NULL, what TEXT NOT NULL,
    slice TEXT NOT NULL, units INTEGER NOT NULL, at INTEGER NOT NULL, idle_seconds INTEGER NOT NULL,
    detail TEXT NOT NULL, PRIMARY KEY (user, server, stretch, what));
"""


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


class ServiceStore:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._db = connect_private(self.path)
        self._lock = threading.Lock()
        with self._lock:
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        self._db.close()

    # ---- Keep ---------------------------------------------------------------------------------
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

    # ---- what was done ------------------------------------------------------------------------
    def record(self, action: IdleAction) -> bool:
        """Record an action; False when the same action was already recorded for the stretch."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO idle_actions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    action.user,
                    action.server,
                    action.stretch,
                    action.what,
                    action.slice,
                    action.units,
                    action.at,
                    action.idle_seconds,
                    action.detail,
                ),
            )
            return cur.rowcount == 1

    def done(self, user: str, server: str, stretch: str) -> set[str]:
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

    def forget_before(self, when: int) -> None:
        """Drop records older than ``when`` (the store stays small)."""
        with self._lock:
            self._db.execute("DELETE FROM idle_actions WHERE at < ?", (when,))
            self._db.execute("DELETE FROM keeps WHERE until < ?", (when,))
