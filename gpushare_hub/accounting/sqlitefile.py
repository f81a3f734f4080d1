"""The service's SQLite files, readable and writable by their owner only (0600).

They hold the pseudonyms' HMAC secret and real user names: created with the process's umask
(often 022), anyone on the hub's machine or volume could read them. SQLite gives its journal,
WAL and shared-memory files the database file's permissions; files left by an older version
are tightened too.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

PRIVATE = 0o600
# The files SQLite keeps beside a database.
SIDE_FILES = ("-journal", "-wal", "-shm")


def connect_private(path: str, timeout: float = 5.0) -> sqlite3.Connection:
    """A connection to the SQLite file at ``path`` (``":memory:"``: none), which is created
    0600 if it does not exist, and made 0600 (with its side files) if it does and is ours."""
    if path != ":memory:":
        file = Path(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(file, os.O_CREAT | os.O_RDWR, PRIVATE))
        for each in (file, *(Path(f"{file}{side}") for side in SIDE_FILES)):
            try:
                if each.stat().st_uid == os.getuid() and each.stat().st_mode & 0o777 != PRIVATE:
                    each.chmod(PRIVATE)
            except FileNotFoundError:
                continue
    return sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=timeout)


class Tables:
    """What the book's rooms (:mod:`.intervals`, :mod:`.records`) share: the one connection to
    the file and the lock that keeps its threads (the service's loop, the planner's worker)
    apart. :class:`~gpushare_hub.accounting.book.Book` opens them."""

    _db: sqlite3.Connection
    _lock: threading.Lock
