"""The service's one query reader: every route's query string is read here, each parameter
allowed, given once, checked and bounded before a handler does any work. A wrong one is a
:class:`QueryError` naming the parameter and the fix; handlers answer it with a 400.

Two shapes of answer: the ledger's filters (``?node=&model=&user=&refresh=``, :func:`parse_query`)
and the values of ``api/v1/history`` and ``api/v1/planning`` (choices, times and short texts,
:func:`query_values`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpushare_hub.core import model_matches
from gpushare_hub.core.reportrows import CardRow, PodRow

NODE_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a DNS-1123 subdomain
MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,62}$")
USER_RE = re.compile(r"^[^\x00-\x1f\x7f/]{1,255}$")
FILTER_KEYS = ("node", "model", "user")
# The times a query may give, as Unix seconds: 1970-01-01 to 9999-12-31 (UTC). A time outside
# cannot be written back as a date (the documents' RFC 3339 times) and no slice was held then.
EARLIEST = 0.0
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
MAX_TEXT = 200


class QueryError(ValueError):
    """A query parameter is wrong; the message names it and what is allowed."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def single_values(query: Mapping[str, Sequence[Any]], allowed: Sequence[str]) -> dict[str, str]:
    """Each parameter of ``query`` (tornado's ``query_arguments``: bytes, or text) as text: only
    the keys in ``allowed``, each given once."""
    values: dict[str, str] = {}
    for key, raw in query.items():
        if key not in allowed:
            raise QueryError(
                key,
                f"unknown query parameter {key[:40]!r}; this endpoint takes {', '.join(allowed) or 'none'}",
            )
        if len(raw) != 1:
            raise QueryError(key, f"query parameter {key[:40]!r} is given {len(raw)} times; give it once")
        values[key] = raw[0].decode("utf-8", "replace") if isinstance(raw[0], bytes) else str(raw[0])
    return values


# ---- the ledger's filters ----------------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    """Only this node, card model and hub user (empty: all)."""

    node: str = ""
    model: str = ""
    user: str = ""
    refresh: int | None = None

    def keeps_card(self, node: str, card: CardRow) -> bool:
        return (not self.node or node == self.node) and (
            not self.model or model_matches(card.model, self.model)
        )

    def keeps_pod(self, pod: PodRow) -> bool:
        return not self.user or pod.hub_user == self.user


def parse_query(query: Mapping[str, Sequence[Any]], allowed: Sequence[str]) -> Filters:
    """Read ``?node=&model=&user=&refresh=`` (only the keys in ``allowed``); raise :class:`QueryError`."""
    values = single_values(query, allowed)
    checks = {
        "node": (NODE_RE, "a node name (lower-case letters, digits, '-' and '.'), e.g. nb-1"),
        "model": (MODEL_RE, "a card model as NVML names it, e.g. Tesla-T4"),
        "user": (USER_RE, "a hub user name"),
    }
    for key, (pattern, what) in checks.items():
        if key in values and not pattern.fullmatch(values[key]):  # fullmatch: no trailing newline
            raise QueryError(
                key, f"query parameter {key}={values[key][:80]!r} is not {what}; leave it out for all"
            )
    refresh = None
    if "refresh" in values:
        raw_refresh = values["refresh"]
        digits = raw_refresh.isascii() and raw_refresh.isdigit() and len(raw_refresh) <= 4
        if not digits or not 1 <= int(raw_refresh) <= 3600:
            raise QueryError(
                "refresh",
                f"query parameter refresh={raw_refresh[:20]!r} is not a number of seconds "
                "from 1 to 3600, e.g. refresh=5",
            )
        refresh = int(raw_refresh)
    return Filters(values.get("node", ""), values.get("model", ""), values.get("user", ""), refresh)


# ---- history and planning ----------------------------------------------------------------------


def query_values(
    query: Mapping[str, Sequence[Any]],
    choices: Mapping[str, tuple[str, ...]],
    times: tuple[str, ...] = (),
    texts: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The query's parameters, each once: one of its ``choices``, a time (``times``: ISO 8601
    dates or times, UTC unless they say otherwise, as Unix seconds from 1970 to 9999) or a short
    text (``texts``, at most :data:`MAX_TEXT` characters); :class:`QueryError` naming any other."""
    out: dict[str, Any] = {}
    for key, value in single_values(query, (*choices, *times, *texts)).items():
        if key in choices:
            if value not in choices[key]:
                raise QueryError(
                    key, f"query parameter {key}={value[:40]!r}: use one of {', '.join(choices[key])}"
                )
            out[key] = value
        elif key in texts:
            if len(value) > MAX_TEXT:
                raise QueryError(key, f"query parameter {key} is longer than {MAX_TEXT} characters")
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
        raise QueryError(
            key,
            f"query parameter {key}={value[:40]!r} is not a date or time; e.g. 2026-11-01 "
            "or 2026-11-01T08:00:00Z",
        ) from None
    if not EARLIEST <= seconds <= LATEST:
        raise QueryError(
            key,
            f"query parameter {key}={value[:40]!r} is not between 1970-01-01 and 9999-12-31 (UTC); "
            "give a time in that range, e.g. 2026-11-01",
        )
    return seconds
