"""The GiB-hour book: every slice a hub user held, what admins added, what was done.

A SQLite file beside the hub's own database (``GPUShareService.state_db``; in Zero to
JupyterHub the hub's volume), the service's other records beside it. The hub service is the
only writer: every pass it records the slices the API server says are held
(:meth:`BudgetStore.observe`), so an interval's start is the pod's placement and its end the
pass that no longer saw it. The spawner, in the hub's process, only reads.

A restart loses at most the time the service was down: an interval still open in the file
whose pod is gone when the service next looks ends when it was last seen, not at the restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import tzinfo
from pathlib import Path
from typing import Any

from gpushare_hub.core.budget import Budget, Held, gib_hours, window_bounds

from .sqlitefile import connect_private

SCHEMA = """
CREATE TABLE IF NOT EXISTS held (
    key TEXT PRIMARY KEY, user TEXT NOT NULL, server TEXT NOT NULL, gib REAL NOT NULL,
    start REAL NOT NULL, seen REAL NOT NULL, "end" REAL,
    slice TEXT NOT NULL DEFAULT '', model TEXT NOT NULL DEFAULT '', created REAL,
    groups TEXT NOT NULL DEFAULT '[]', idle_seconds REAL);
CREATE INDEX IF NOT EXISTS held_user ON held (user, start);
CREATE TABLE IF NOT EXISTS budget_added (
    user TEXT NOT NULL, window_start REAL NOT NULL, gib_hours REAL NOT NULL, by TEXT NOT NULL,
    at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS budget_actions (
    user TEXT NOT NULL, window_start REAL NOT NULL, what TEXT NOT NULL, at REAL NOT NULL,
    detail TEXT NOT NULL, PRIMARY KEY (user, window_start, what));
"""


# Closed intervals and additions are kept at least this long (two months: any window, and the
# last); the history's retention (history_retention_days) may keep them longer. The service's
# Keep presses and idle actions are kept as long as the book.
KEEP_SECONDS = 62 * 86400

COLUMNS = 'key, user, gib, start, "end", server, slice, model, created, groups, idle_seconds'
# Columns added to the first schema of ``held``, and how (see BudgetStore._add_columns).
ADDED_COLUMNS = (
    ("slice", "TEXT NOT NULL DEFAULT ''"),
    ("model", "TEXT NOT NULL DEFAULT ''"),
    ("created", "REAL"),
    ("groups", "TEXT NOT NULL DEFAULT '[]'"),
    ("idle_seconds", "REAL"),
)


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


class BudgetStore:
    """The book on disk (module docstring). Safe to share between threads."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._db = connect_private(self.path, timeout=10)
        self._lock = threading.Lock()
        self._key: bytes | None = None  # the pseudonyms' secret, read once
        with self._lock:
            if self.path != ":memory:":
                # Readers (the spawner) never wait for the writer (the service), nor it for them.
                self._db.execute("PRAGMA journal_mode=WAL")
                # SQLite's advice for WAL: commits are not synced one by one, only checkpoints. A
                # crash of the service loses nothing; the machine's own power loss can undo the
                # last commits (a few passes of usage), never corrupt the book.
                self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
            self._add_columns()

    def _add_columns(self) -> None:
        """A file from before the history's columns (slice, model, created, groups) gains them."""
        have = {row[1] for row in self._db.execute("PRAGMA table_info(held)")}
        for column, kind in ADDED_COLUMNS:
            if column not in have:
                self._db.execute(f"ALTER TABLE held ADD COLUMN {column} {kind}")

    def close(self) -> None:
        self._db.close()

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

    def budget(self, user: str, limit: float, window: str, tz: tzinfo, now: float) -> Budget:
        """``user``'s budget of ``limit`` GiB·h in the ``window`` (day, week, month) holding
        ``now``: what they used and what admins added there (the spawner and the service both)."""
        start, end = window_bounds(now, window, tz)
        return Budget(
            window,
            start,
            end,
            limit=limit,
            used=self.used(user, start, end, now),
            added=self.added(user, start),
        )

    def used_by_user(self, start: float, end: float, now: float) -> dict[str, float]:
        by_user: dict[str, list[Held]] = {}
        for h in self.intervals(start, end):
            by_user.setdefault(h.user, []).append(h)
        return {user: gib_hours(held, start, end, now) for user, held in by_user.items()}

    # ---- what admins added ----------------------------------------------------------------------
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
    def record(self, user: str, window_start: float, what: str, at: float, detail: str = "") -> bool:
        """Record ``warned``, ``notified``, ``stopped`` or ``parked``; False when already recorded."""
        with self._lock:
            cur = self._db.execute(
                "INSERT OR IGNORE INTO budget_actions VALUES (?, ?, ?, ?, ?)",
                (user, window_start, what, at, detail),
            )
            return cur.rowcount == 1

    def actions(self, user: str, window_start: float) -> dict[str, float]:
        """What was done about ``user``'s spent window, with when."""
        with self._lock:
            rows = self._db.execute(
                "SELECT what, at FROM budget_actions WHERE user = ? AND window_start = ?",
                (user, window_start),
            ).fetchall()
        return {what: at for what, at in rows}

    def forget(self, what: str, user: str, window_start: float) -> None:
        with self._lock:
            self._db.execute(
                "DELETE FROM budget_actions WHERE user = ? AND window_start = ? AND what = ?",
                (user, window_start, what),
            )

    # ---- pseudonyms for the history's export ------------------------------------------------------
    def pseudonym(self, user: str) -> str:
        """A stable stand-in for ``user``: the same in every export from this database, and
        not to be turned back into the name without the database's own secret."""
        return "user-" + hmac.new(self._secret(), user.encode(), hashlib.sha256).hexdigest()[:12]

    def server_pseudonym(self, user: str, server: str) -> str:
        """A stable stand-in for ``user``'s named server ``server`` (users choose those names)."""
        digest = hmac.new(self._secret(), f"{user}/{server}".encode(), hashlib.sha256).hexdigest()
        return "server-" + digest[:8]

    def _secret(self) -> bytes:
        if self._key is None:
            with self._lock:
                self._db.execute(
                    "INSERT OR IGNORE INTO secrets VALUES ('pseudonyms', ?)", (secrets.token_hex(32),)
                )
                (value,) = self._db.execute("SELECT value FROM secrets WHERE name = 'pseudonyms'").fetchone()
            self._key = bytes.fromhex(value)
        return self._key

    def forget_before(self, when: float) -> None:
        """Drop what ended before ``when`` (the file stays small; keep at least one window)."""
        with self._lock:
            self._db.execute('DELETE FROM held WHERE "end" IS NOT NULL AND "end" < ?', (when,))
            self._db.execute("DELETE FROM budget_added WHERE at < ? AND window_start < ?", (when, when))
            self._db.execute("DELETE FROM budget_actions WHERE at < ?", (when,))
