"""The status of this server's GPU slice, as the JupyterLab status bar shows it. Pure.

:func:`status_document` is the answer of ``<base>gpushare/api/status``: the local slice
(:func:`sliceinfo.as_json`), the hub service's ``api/v1/me`` document (or ``None``), this server's
allocation in it, a problem in words (``""`` when there is none) and the one-line text, e.g.
``GPU 3.1 / 5 GiB · hook cap · 2 others on this card``.

The hub document comes from another process: every key is read with its type checked, and a
missing or odd one only drops that part of the text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpushare_hub.core.durations import duration_words, returned_words
from gpushare_hub.core.names import RETURNED_ENV, SERVICE_URL_ENV
from gpushare_hub.core.usage import NOT_MEASURED

from .overslice import over_problem, over_warning
from .sliceinfo import SliceInfo, as_json

NOT_CONFIGURED = "hub service not configured for this server"
UNREACHABLE = "hub service unreachable"
NOT_LISTED = "hub service lists no slice of this server"


def me_url(env: Mapping[str, str]) -> tuple[str, str]:
    """The hub service's ``api/v1/me`` address from ``$GPUSHARE_SERVICE_URL``, or a problem."""
    base = env.get(SERVICE_URL_ENV, "").strip()
    if not base:
        return "", f"{NOT_CONFIGURED}: ${SERVICE_URL_ENV} is not set (GPUShareSpawner sets it)"
    if not base.startswith(("http://", "https://")) or any(c.isspace() for c in base):
        return "", f"{NOT_CONFIGURED}: ${SERVICE_URL_ENV} is not an http(s) address: {base[:80]!r}"
    return base.rstrip("/") + "/api/v1/me", ""


def _count(value: object) -> int | float | None:
    """A number of MiB, GiB or servers, or ``None`` (JSON's true is no number)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return value


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def pick_allocation(doc: Mapping[str, Any] | None, server_name: str) -> Mapping[str, Any] | None:
    """The allocation of this server in an ``api/v1/me`` document: its ``server`` is
    ``$JUPYTERHUB_SERVER_NAME`` (``""`` for the default server)."""
    allocations = (doc or {}).get("allocations")
    if not isinstance(allocations, list):
        return None
    for a in allocations:
        if isinstance(a, Mapping) and a.get("server") == server_name:
            return a
    return None


def cap_words(info: SliceInfo, allocation: Mapping[str, Any] | None) -> str:
    """The cap in force, in two words: the hub's isolation tier where it says one, else what the
    environment shows (an MPS limit, the start-up hook's PyTorch cap)."""
    isolation = _mapping((allocation or {}).get("isolation"))
    tier = _text(isolation.get("tier"))
    if tier == "mps" or (not tier and info.mps_limit):
        return "MPS cap"
    if tier == "driver":
        return "driver cap"
    if tier == "cooperative" or (not tier and info.torch_fraction is not None):
        return "hook cap" if info.hook_on_path else "no cap: hook not loaded"
    return _text(isolation.get("words"))


def _others(count: int | float) -> str:
    if count == 0:
        return "alone on this card"
    return "1 other on this card" if count == 1 else f"{count:g} others on this card"


def short(problem: str) -> str:
    """The words of a problem before its detail: ``hub service unreachable``."""
    return problem.split(":", 1)[0]


def returned_slice(env: Mapping[str, str]) -> Mapping[str, Any]:
    """What ``$GPUSHARE_RETURNED`` says went back when the hub service parked this server on a
    CPU-only profile (empty when it did not, or the value is not the spawner's)."""
    raw = env.get(RETURNED_ENV, "")
    if not raw or len(raw) > 1000:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    value = _mapping(value)
    units, idle = _count(value.get("units")), _count(value.get("idle_seconds"))
    if units is None or idle is None:
        return {}
    return {"slice": _text(value.get("slice")), "units": units, "idle_seconds": idle}


def returned_note(returned: Mapping[str, Any]) -> str:
    """``your 5 GiB slice was returned after 2 h idle on the GPU: start it again from the spawn page``."""
    if not returned:
        return ""
    slice_words = returned_words(f"{returned['units']:g} GiB slice", returned["idle_seconds"])
    return f"{slice_words}: start it again from the spawn page"


def status_text(
    info: SliceInfo,
    allocation: Mapping[str, Any] | None,
    problem: str,
    hub: Mapping[str, Any] | None = None,
    returned: Mapping[str, Any] | None = None,
) -> str:
    """One line for the status bar."""
    if not info.has_gpu:
        words = returned_note(returned or {})
        return f"no GPU slice · {words}" if words else "no GPU slice"
    units = _count((allocation or {}).get("units"))
    size = (
        f"{info.slice_gib} GiB"
        if info.slice_gib is not None
        else f"{units:g} GiB"
        if units is not None
        else "a share"
    )
    if allocation is None:
        return f"GPU {size} · {short(problem) or NOT_LISTED}"
    used = _count(allocation.get("used_mib"))
    parts = [f"GPU {used / 1024:.1f} / {size}" if used is not None else f"GPU ? / {size}"]
    if used is None:
        parts.append(_text(allocation.get("usage_note")) or NOT_MEASURED)
    cap = cap_words(info, allocation)
    if cap:
        parts.append(cap)
    neighbours = _count(_mapping(allocation.get("neighbours")).get("count"))
    if neighbours is not None:
        parts.append(_others(neighbours))
    warning = budget_warning(hub) or idle_warning(allocation) or over_warning(allocation)
    if warning:
        parts.insert(0, warning)
    return " · ".join(parts)


def budget_warning(hub: Mapping[str, Any] | None) -> str:
    """``GPU budget spent: returned at 14:05`` once the user's GiB·h budget is spent."""
    budget = _mapping((hub or {}).get("budget"))
    if budget.get("spent") is not True:
        return ""
    over = _mapping(budget.get("overrun"))
    due = _text(over.get("due_at"))
    if over.get("action") in ("stop", "park") and len(due) >= 16:
        return f"GPU budget spent: returned at {due[11:16]}"
    return "GPU budget spent"


def budget_problem(hub: Mapping[str, Any] | None) -> str:
    """The service's words for a spent budget, with when it resets (the panel shows them)."""
    if not budget_warning(hub):
        return ""
    budget = _mapping((hub or {}).get("budget"))
    words, resets = _text(budget.get("words")), _text(budget.get("resets_words"))
    return f"GPU budget spent: {words}; it resets {resets}" if words and resets else "GPU budget spent"


def idle_warning(allocation: Mapping[str, Any] | None) -> str:
    """``GPU idle: returned in 10 min`` while the hub service's idle rule is about to act."""
    ret = _mapping((allocation or {}).get("idle_return"))
    if ret.get("phase") not in ("warning", "due") or ret.get("action") not in ("stop", "park"):
        return ""
    left = _count(ret.get("seconds_left"))
    if ret.get("phase") == "due" or not left:
        return "GPU idle: being returned"
    return f"GPU idle: returned in {duration_words(left)}"


def idle_problem(allocation: Mapping[str, Any] | None) -> str:
    """The service's words for a slice about to be returned (the panel shows them)."""
    ret = _mapping((allocation or {}).get("idle_return"))
    return _text(ret.get("words")) if idle_warning(allocation) else ""


def status_document(
    info: SliceInfo,
    hub: Mapping[str, Any] | None,
    problem: str,
    server_name: str,
    returned: Mapping[str, Any] | None = None,
    processes: list[tuple[int, int, str]] | None = None,
) -> dict[str, object]:
    """The answer of ``gpushare/api/status``; ``returned``: :func:`returned_slice`;
    ``processes``: the container's GPU processes (:func:`.overslice.server_processes`)."""
    allocation = pick_allocation(hub, server_name) if info.has_gpu else None
    if info.has_gpu and hub is not None and allocation is None and not problem:
        problem = (
            f"{NOT_LISTED}: the service's view of the cluster may not have caught up with this "
            f"server yet (server name {server_name!r})"
        )
    problem = (
        problem
        or budget_problem(hub)
        or idle_problem(allocation)
        or over_problem(allocation, processes or [])
    )
    return {
        "slice": as_json(info),
        "hub": dict(hub) if hub is not None else None,
        "allocation": dict(allocation) if allocation is not None else None,
        "problem": problem,
        "text": status_text(info, allocation, problem, hub, returned),
    }
