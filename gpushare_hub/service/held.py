"""The slices hub users hold now, read from the ledger document's allocations into the book's
:class:`~gpushare_hub.core.budget.Held` rows (times as Unix seconds): what the GiB-hour book
records every pass and what the history is made of."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from gpushare_hub.core.budget import Held


def _parsed(when: str) -> float | None:
    """An RFC 3339 time as Unix seconds; None when there is none or it cannot be read."""
    try:
        return datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp() if when else None
    except ValueError:
        return None


def held_now(
    allocations: Iterable[Mapping[str, Any]],
    now: float,
    models: Mapping[str, str] | None = None,
    groups: Mapping[str, list[str]] | None = None,
) -> list[Held]:
    """The hub users' slices in a ledger document's allocations: one per pod placement (a pod
    on several cards sums them), with the card model (``models``: by card UUID) and the user's
    groups for the history."""
    held: dict[str, Held] = {}
    for a in allocations:
        if not a.get("hub_user"):
            continue
        user = str(a["hub_user"])
        # Held from the bind (the API server's PodScheduled time); else from when the card was
        # handed out, the pod started or was made (``since``).
        scheduled = _parsed(str(a.get("scheduled") or ""))
        since = _parsed(str(a.get("since") or ""))
        start = scheduled if scheduled is not None else since if since is not None else now
        key = f"{a['namespace']}/{a['pod']}@{int(start)}"
        prior = held.get(key)
        gib = float(a["units"]) + (prior.gib if prior else 0.0)
        # The spawn's wait (start - created) only where the bind time is known.
        created = _parsed(str(a.get("created") or "")) if scheduled is not None else None
        held[key] = Held(
            key,
            user,
            gib,
            start,
            None,
            str(a.get("server") or ""),
            slice=str(a.get("slice") or ""),
            model=(models or {}).get(str(a.get("card_uuid") or ""), ""),
            created=created,
            groups=tuple((groups or {}).get(user, [])),
            measured=a.get("used_mib") is not None or (prior.measured if prior else False),
            idle_since=_idle_since(a, prior),
        )
    return list(held.values())


def _idle_since(a: Mapping[str, Any], prior: Held | None) -> float | None:
    """Since when the pod has been idle on the GPU (a pod on several cards: idle on all of
    them, since the latest); None while it is busy or not measured."""
    since = a.get("gpu_idle_since")
    mine = float(since) if isinstance(since, int | float) and not isinstance(since, bool) else None
    if prior is None:
        return mine
    if mine is None or prior.idle_since is None:
        return None
    return max(mine, prior.idle_since)
