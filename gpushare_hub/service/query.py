"""The query strings of ``api/v1/history`` and ``api/v1/planning``: every parameter read, checked
and bounded before the handler does any work; 400 naming the parameter and the fix otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from tornado import web

# The times a query may give, as Unix seconds: 1970-01-01 to 9999-12-31 (UTC). A time outside
# cannot be written back as a date (the documents' RFC 3339 times) and no slice was held then.
EARLIEST = 0.0
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
MAX_TEXT = 200


def query_values(
    handler: web.RequestHandler,
    choices: Mapping[str, tuple[str, ...]],
    times: tuple[str, ...] = (),
    texts: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The query's parameters, each once: one of its ``choices``, a time (``times``: ISO 8601
    dates or times, UTC unless they say otherwise, as Unix seconds from 1970 to 9999) or a short
    text (``texts``, at most :data:`MAX_TEXT` characters); 400 naming any other."""
    out: dict[str, Any] = {}
    allowed = (*choices, *times, *texts)
    for key, values in handler.request.query_arguments.items():
        if key not in allowed:
            raise web.HTTPError(
                400, f"unknown query parameter {key[:40]!r}; this endpoint takes {', '.join(allowed)}"
            )
        if len(values) != 1:
            raise web.HTTPError(400, f"query parameter {key!r} is given {len(values)} times; give it once")
        value = values[0].decode(errors="replace")
        if key in choices:
            if value not in choices[key]:
                raise web.HTTPError(
                    400,
                    f"query parameter {key}={value[:40]!r}: use one of {', '.join(choices[key])}",
                )
            out[key] = value
        elif key in texts:
            if len(value) > MAX_TEXT:
                raise web.HTTPError(400, f"query parameter {key} is longer than {MAX_TEXT} characters")
            out[key] = value
        else:
            out[key] = _time(key, value)
    return out


def _time(key: str, value: str) -> float:
    """An ISO 8601 date or time (UTC unless it says otherwise) from 1970 to 9999, as Unix seconds."""
    try:
        when = datetime.fromisoformat(value)
        seconds = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    except (ValueError, OverflowError):
        raise web.HTTPError(
            400,
            f"query parameter {key}={value[:40]!r} is not a date or time; e.g. 2026-11-01 "
            "or 2026-11-01T08:00:00Z",
        ) from None
    if not EARLIEST <= seconds <= LATEST:
        raise web.HTTPError(
            400,
            f"query parameter {key}={value[:40]!r} is not between 1970-01-01 and 9999-12-31 (UTC); "
            "give a time in that range, e.g. 2026-11-01",
        )
    return seconds
