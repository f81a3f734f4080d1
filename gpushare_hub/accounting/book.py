"""The book: the hub service's one SQLite file, beside the hub's own database
(``GPUShareService.state_db``; in Zero to JupyterHub the hub's volume).

It holds every slice a hub user held (:mod:`.intervals`: the GiB·h budgets, the history and the
planner count from it), what admins added to budgets and what the service did about spent
budgets and idle slices, with the Keep presses (:mod:`.records`), and the secret of the
history's pseudonyms. The hub service is the only writer; the spawner, in the hub's process,
only reads (a budget's numbers on the spawn form). A restart of either loses nothing: every
action is recorded before the next pass, every interval as it is seen.

Everything is kept as long as the history (``history_retention_days``, at least
:data:`KEEP_SECONDS`): :meth:`Book.forget_before` drops the rest.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from datetime import tzinfo
from pathlib import Path

from gpushare_hub.core.budget import Budget, window_bounds

from .intervals import Intervals
from .records import Records
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
CREATE TABLE IF NOT EXISTS keeps (
    user TEXT NOT NULL, server TEXT NOT NULL, stretch TEXT NOT NULL, until INTEGER NOT NULL,
    pressed INTEGER NOT NULL, PRIMARY KEY (user, server, stretch));
CREATE TABLE IF NOT EXISTS idle_actions (
    user TEXT NOT NULL, server TEXT NOT NULL, stretch TEXT NOT NULL, what TEXT NOT NULL,
    slice TEXT NOT NULL, units INTEGER NOT NULL, at INTEGER NOT NULL, idle_seconds INTEGER NOT NULL,
    detail TEXT NOT NULL, PRIMARY KEY (user, server, stretch, what));
"""

# Everything is kept at least this long (two months: any budget window, and the last one).
KEEP_SECONDS = 62 * 86400

# Columns added to the first schema of ``held``, and how (see Book._add_columns).
ADDED_COLUMNS = (
    ("slice", "TEXT NOT NULL DEFAULT ''"),
    ("model", "TEXT NOT NULL DEFAULT ''"),
    ("created", "REAL"),
    ("groups", "TEXT NOT NULL DEFAULT '[]'"),
    ("idle_seconds", "REAL"),
)


class Book(Intervals, Records):
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
        """Drop what ended, was added or was done before ``when``, and the Keep presses that ran
        out then (the file stays small; keep at least one window)."""
        with self._lock:
            self._db.execute('DELETE FROM held WHERE "end" IS NOT NULL AND "end" < ?', (when,))
            self._db.execute("DELETE FROM budget_added WHERE at < ? AND window_start < ?", (when, when))
            self._db.execute("DELETE FROM budget_actions WHERE at < ?", (when,))
            self._db.execute("DELETE FROM idle_actions WHERE at < ?", (when,))
            self._db.execute("DELETE FROM keeps WHERE until < ?", (when,))
