"""The hub's history of slices held, as an admin exports it (``api/v1/history``) for capacity
planning: one row per placement, in JSON or CSV, user names replaced by pseudonyms unless asked.

The rows come from the GiB·h book (:class:`~gpushare_hub.core.budget.Held`); this module only
shapes them. Keys and CSV columns are a contract: planning tools read them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from .budget import Held

# A placement more than this many seconds after its pod was made waited for a card (the
# scheduler places a pod that fits within a second or two).
WAITED_AFTER = 10.0
# What a spreadsheet reads as the start of a formula (OWASP's list for CSV injection).
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
COLUMNS = (
    "user",
    "groups",
    "server",
    "slice",
    "gib",
    "model",
    "created",
    "start",
    "end",
    "held_seconds",
    "wait_seconds",
    "waited",
    "idle_seconds",
)


def _iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def history_rows(
    held: Iterable[Held],
    now: float,
    name: Callable[[str], str] = lambda user: user,
    server_name: Callable[[str, str], str] = lambda user, server: server,
) -> list[dict[str, Any]]:
    """One row per placement, whole (not clipped to a range); a slice still held has ``end``
    null and is counted up to ``now``. ``name``: what stands for a user (a pseudonym, or the
    name itself); ``server_name``: for a user's named server (users choose those names)."""
    rows = []
    for h in held:
        wait = None if h.created is None else max(0.0, h.start - h.created)
        rows.append(
            {
                "user": name(h.user),
                "groups": sorted(h.groups),
                "server": server_name(h.user, h.server) if h.server else "",
                "slice": h.slice,
                "gib": h.gib,
                "model": h.model,
                "created": _iso(h.created),
                "start": _iso(h.start),
                "end": _iso(h.end),
                "held_seconds": round(max(0.0, (now if h.end is None else h.end) - h.start), 1),
                "wait_seconds": None if wait is None else round(wait, 1),
                "waited": None if wait is None else wait > WAITED_AFTER,
                "idle_seconds": None if h.idle_seconds is None else round(h.idle_seconds, 1),
            }
        )
    return rows


def to_csv(rows: Iterable[dict[str, Any]]) -> str:
    """The rows as CSV with a header; groups joined by ``;``, nulls as empty cells."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        cells = []
        for col in COLUMNS:
            value = row[col]
            if col == "groups":
                value = ";".join(value)
            elif isinstance(value, bool):
                value = "true" if value else "false"
            if isinstance(value, str) and value.startswith(FORMULA_START):
                value = "'" + value  # a user's server name is no formula in a spreadsheet
            cells.append("" if value is None else value)
        writer.writerow(cells)
    return out.getvalue()
