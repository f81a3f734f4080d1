"""The hub's servers as its REST API reports them (``GET /hub/api/users``), read into values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
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


def _parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def idle_seconds(last_activity: str, now: datetime) -> int | None:
    when = _parse_time(last_activity) if last_activity else None
    return None if when is None else max(0, int((now - when).total_seconds()))
