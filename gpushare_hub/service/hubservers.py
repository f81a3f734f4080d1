"""The hub's servers as its REST API reports them (``GET /hub/api/users``), read into values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True)
class HubServer:
    """One of the hub's servers, as its REST API reports it (times are RFC 3339 strings)."""

    user: str
    server: str = ""
    started: str = ""
    last_activity: str = ""


def servers_from_users(users: Iterable[Mapping[str, Any]]) -> tuple[list[HubServer], dict[str, list[str]]]:
    """The servers and each user's groups, from ``GET /hub/api/users`` models (untrusted shapes skipped)."""
    servers: list[HubServer] = []
    groups: dict[str, list[str]] = {}
    for user in users:
        if not isinstance(user, Mapping) or not isinstance(user.get("name"), str):
            continue
        name = user["name"]
        listed = user.get("groups")
        groups[name] = [g for g in listed if isinstance(g, str)] if isinstance(listed, list) else []
        owned = user.get("servers")
        for sname, srv in owned.items() if isinstance(owned, Mapping) else ():
            if not isinstance(sname, str) or not isinstance(srv, Mapping):
                continue
            servers.append(
                HubServer(
                    user=name,
                    server=str(sname),
                    started=str(srv.get("started") or ""),
                    last_activity=str(srv.get("last_activity") or user.get("last_activity") or ""),
                )
            )
    return servers, groups


def seconds_of(text: str) -> float | None:
    """An RFC 3339 time (the API server's, the hub's) as Unix seconds; None when there is none
    or it cannot be read. The one reader of times that come in as text."""
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def rfc3339(seconds: float | None) -> str:
    """Unix seconds as RFC 3339 in UTC ("" for None): what the API's documents say, written
    only at the edge. Whole seconds as ``2026-11-27T10:00:00Z``, else with microseconds."""
    if seconds is None:
        return ""
    when = datetime.fromtimestamp(seconds, UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if when.microsecond else "%Y-%m-%dT%H:%M:%SZ")


def idle_seconds(last_activity: float | None, now: float) -> int | None:
    """Seconds since the hub last saw activity (None: it never did)."""
    return None if last_activity is None else max(0, int(now - last_activity))
