"""gpushare-hub's start-up hook, the out-of-memory note: what it says (``_gpushare_hub_oomhandler.py``
attaches it where the error is shown).

Part of the start-up hook: ``sitecustomize.py`` beside it loads this file at every Python start.
The note names the slice, the cap that stopped the allocation, what this process holds, the
server's other GPU processes (from the container ledger), the card's other holders (a count and
totals) and the way out, a larger slice that is free now; those last two come from the hub
service's ``api/v1/me`` (``$GPUSHARE_SERVICE_URL``, with ``$JUPYTERHUB_API_TOKEN``; 2 s at most,
and the note says so when it cannot be asked). :func:`explain_oom` builds the text;
:func:`ask_service` asks the service.

Standard library only, Python 3.8 or later, as the hook; never raises for what the service answers.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing itself costs ~3 ms at every start-up: only for the type checker
if TYPE_CHECKING:
    from typing import Any, Mapping  # noqa: UP035 - collections.abc's is not subscriptable on 3.8

    from gpushare_hub.isolation.hook import _gpushare_hub_caps as caps
else:  # loaded by sitecustomize.py before this module
    import _gpushare_hub_caps as caps

LIMIT_VAR, CARD_VAR, MPS_VAR, MIB = caps.LIMIT_VAR, caps.CARD_VAR, caps.MPS_VAR, caps.MIB
_debug, _positive_int = caps._debug, caps._positive_int

SERVICE_URL_VAR = "GPUSHARE_SERVICE_URL"
TOKEN_VAR = "JUPYTERHUB_API_TOKEN"
SERVER_VAR = "JUPYTERHUB_SERVER_NAME"
TIER_VAR = "GPUSHARE_ISOLATION_TIER"
# The container's cards: Allocate's GPUSHARE_CARD_UUIDS (core/names.py CARD_UUIDS_ENV), else the
# legacy NVIDIA_VISIBLE_DEVICES (in CDI mode that one is "void").
CARD_UUID_VARS = ("GPUSHARE_CARD_UUIDS", "NVIDIA_VISIBLE_DEVICES")
SERVICE_TIMEOUT = 2.0
MAX_ME_BYTES = 1 << 20
NOTE_MARK = "gpushare-hub:"
GIB = 1024 * MIB
TIERS = ("cooperative", "mps", "driver")

# What stopped the allocation, by tier (and framework, for the frameworks' own caps).
FRAMEWORK_CAPS = {
    "torch": "PyTorch's per-process fraction set by gpushare-hub's start-up hook",
    "cupy": "CuPy's memory-pool limit (CUPY_GPU_MEMORY_LIMIT) kept to the slice by gpushare-hub",
    "jax": "JAX's memory fraction (XLA_PYTHON_CLIENT_MEM_FRACTION) set by gpushare-hub's device plugin",
}
HARD_CAPS = {"mps": "the MPS pinned-memory limit", "driver": "the driver's memory limit"}
TIER_WORDS = {
    "cooperative": "cooperative limit for the whole server",
    "mps": "hard limit per process by MPS",
    "driver": "hard limit by the driver",
}
NAMES = {"torch": "PyTorch", "cupy": "CuPy", "jax": "JAX"}
FREE_HINTS = {
    "torch": "del the tensors you no longer need, then torch.cuda.empty_cache()",
    "cupy": "del the arrays you no longer need, then cupy.get_default_memory_pool().free_all_blocks()",
    "jax": "del the arrays you no longer need",
}


_REQUEST = (
    (r"Tried to allocate (\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB)", None),  # PyTorch
    (r"allocating ([\d,]+) bytes", "bytes"),  # CuPy
    (r"allocate (\d+) bytes", "bytes"),  # JAX
)
_SCALE = {"bytes": 1, "KiB": 1024, "MiB": MIB, "GiB": GIB}


def _requested(exc: BaseException | None) -> int | None:
    """The size the failed allocation asked for, in bytes, read from the error's message."""
    import re

    text = str(exc) if exc is not None else ""
    for pattern, unit in _REQUEST:
        m = re.search(pattern, text)
        if m:
            return int(float(m.group(1).replace(",", "")) * _SCALE[unit or m.group(2)])
    return None


def _held(framework: str) -> tuple[int | None, int | None]:
    """(in use, reserved) bytes of this process in ``framework``'s allocator, where it says."""
    try:
        if framework == "torch":
            cuda = sys.modules["torch"].cuda
            return int(cuda.memory_allocated()), int(cuda.memory_reserved())
        if framework == "cupy":
            pool = sys.modules["cupy"].get_default_memory_pool()
            return int(pool.used_bytes()), int(pool.total_bytes())
    except Exception as err:
        _debug(f"could not read {framework}'s memory use: {err!r}")
    return None, None


def _size(n: float) -> str:
    if n >= GIB:
        return f"{n / GIB:.2f}".rstrip("0").rstrip(".") + " GiB"
    return f"{n / MIB:.0f} MiB"


def _text(value: Any, limit: int = 80) -> str:
    """A string from the service's answer, shown to the user: printable, bounded; '' otherwise."""
    if not isinstance(value, str):
        return ""
    clean = "".join(ch for ch in value if ch.isprintable())
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def ask_service(env: Mapping[str, str] | None = None) -> dict[str, Any] | str:
    """The hub service's ``api/v1/me`` for this server's user, or why it could not be had."""
    import json
    import urllib.error
    import urllib.request

    env = os.environ if env is None else env
    base = env.get(SERVICE_URL_VAR, "").strip()
    token = env.get(TOKEN_VAR, "").strip()
    if not base:
        return f"{SERVICE_URL_VAR} is not set"
    if not base.startswith(("http://", "https://")):
        return f"{SERVICE_URL_VAR}={base[:80]!r} is not an http(s) URL"
    if not token:
        return f"{TOKEN_VAR} is not set"
    url = base.rstrip("/") + "/api/v1/me"
    request = urllib.request.Request(
        url, headers={"Authorization": "token " + token, "Accept": "application/json"}
    )
    try:
        # No proxy from the environment: the hub's service is inside the cluster, and the
        # server's token must not go anywhere else.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=SERVICE_TIMEOUT) as resp:
            body = resp.read(MAX_ME_BYTES + 1)
    except urllib.error.HTTPError as err:
        return f"{url} answered {err.code} {err.reason}"
    except Exception as err:  # URLError, a timeout, a reset: all say the same to the user
        reason = getattr(err, "reason", None) or err
        return f"{url}: {reason}"
    if len(body) > MAX_ME_BYTES:
        return f"{url} answered more than {MAX_ME_BYTES} bytes"
    try:
        doc = json.loads(body)
    except ValueError:
        return f"{url} did not answer JSON"
    if not isinstance(doc, dict):
        return f"{url} did not answer a JSON object"
    return doc


def _my_allocation(doc: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any] | None:
    """This server's entry of ``allocations``: by server name, else by card."""
    allocations = doc.get("allocations")
    if not isinstance(allocations, list):
        return None
    mine = [a for a in allocations if isinstance(a, dict)]
    server = env.get(SERVER_VAR, "")
    for a in mine:
        if (a.get("server") or "") == server:
            return a
    card = next((env[v] for v in CARD_UUID_VARS if env.get(v)), "").split(",")[0].strip()
    return next((a for a in mine if card and a.get("card_uuid") == card), None)


def _tier(env: Mapping[str, str], allocation: Mapping[str, Any] | None) -> str:
    """The node's isolation tier: the service's (which counts a failed self-test), else
    Allocate's word for it (the node's claim), else what the environment shows (an MPS limit,
    or the cooperative cap every slice has)."""
    isolation = (allocation or {}).get("isolation")
    for claimed in (isolation.get("tier") if isinstance(isolation, dict) else "", env.get(TIER_VAR, "")):
        if isinstance(claimed, str) and claimed.strip().lower() in TIERS:
            return claimed.strip().lower()
    return "mps" if env.get(MPS_VAR) else "cooperative"


def explain_oom(
    exc: BaseException | None = None,
    framework: str = "torch",
    env: Mapping[str, str] | None = None,
    me: Mapping[str, Any] | str | None = None,
    held: tuple[int | None, int | None] | None = None,
    siblings: list[tuple[int, int, str]] | None = None,
) -> str | None:
    """The note for an out-of-memory error of ``framework`` in a process with a slice (None without).

    ``me``: the hub service's ``api/v1/me`` document, or the reason it could not be asked; asked
    now when None. ``held``: (in use, reserved) bytes of this process; read from the framework
    when None. ``siblings``: the server's other GPU processes as the container ledger has them
    (pid, bytes held, what each is); read from the ledger when None. Of other servers only counts
    and totals are shown, never who they are.
    """
    env = os.environ if env is None else env
    slice_mib = _positive_int(LIMIT_VAR, env)
    if slice_mib is None:
        return None
    if me is None:
        me = ask_service(env)
    doc: Mapping[str, Any] = me if isinstance(me, dict) else {}
    allocation = _my_allocation(doc, env) or {}
    unit = _text(doc.get("unit"), 10) or "GiB"
    tier = _tier(env, allocation)
    isolation = allocation.get("isolation")
    words = _text(isolation.get("words") if isinstance(isolation, dict) else None) or TIER_WORDS[tier]
    cap = HARD_CAPS.get(tier) or FRAMEWORK_CAPS.get(framework, FRAMEWORK_CAPS["torch"])
    name = NAMES.get(framework, framework)
    used, reserved = held if held is not None else _held(framework)
    in_use = reserved if reserved is not None else used
    asked = _requested(exc)
    if siblings is None:
        siblings = caps.ledger.others() if caps.ledger is not None else []
    mine = sum(min(h, slice_mib * MIB) for _pid, h, _what in siblings)

    card_mib = _positive_int(CARD_VAR, env)
    # What this process's framework may hold with the others' entries counted: the slice's part
    # of CUDA's memory less this process's context (core/cardmemory.py, as the caps take it).
    cuda_mib, context = (
        _positive_int(caps.CARD_CUDA_VAR, env),
        (_positive_int(caps.CONTEXT_VAR, env) or 0) * MIB,
    )
    budget = slice_mib * MIB
    if card_mib and cuda_mib and cuda_mib < card_mib:
        budget = slice_mib * cuda_mib // card_mib * MIB
    budget -= context
    slice_name = _text(allocation.get("slice"), 40)
    first = f"{NOTE_MARK} this server's GPU slice is {_size(slice_mib * MIB)}" + (
        f" ({slice_name})" if slice_name else ""
    )
    first += f" of a {_size(card_mib * MIB)} card" if card_mib else ""
    # Only the framework's own cap counts what this process asked alone; MPS and the driver also
    # count its CUDA context and the server's other processes, so "it fits" proves nothing there.
    if tier == "cooperative" and in_use is not None and asked is not None and in_use + asked + mine <= budget:
        first += (
            f". This allocation fits in the slice, so no cap stopped it: the card itself is full "
            f"(its other holders use more than their slices, or memory outside {name} is in use)."
        )
    elif in_use is not None and asked is not None:
        whose = "this server" if mine else "the process"
        first += f". This allocation would take {whose} past its slice; {cap} ({words}) stopped it."
    else:
        first += f"; the cap here is {cap} ({words})."
    lines = [first]

    if in_use is not None:
        holds = f"This process holds {_size(in_use)}"
        if used is not None and reserved is not None and reserved > used:
            holds += f" ({_size(used)} in use by {name}, the rest cached)"
        holds += f" and asked for {_size(asked)} more." if asked is not None else "."
        own = _count(allocation.get("used_mib"))
        if own is not None:
            holds += f" All processes of this server use {_size(own * MIB)} of the card."
        lines.append(holds)
    holding = sorted(((h, what) for _pid, h, what in siblings if h > 0), reverse=True)
    if holding:
        which = ", ".join(_text(what) for _h, what in holding[:4]) + (", ..." if len(holding) > 4 else "")
        lines.append(
            f"This server's other GPU processes hold {_size(mine)} of the slice"
            + (" (each with its CUDA context)" if context else "")
            + f": {which}. The slice is for all of them together: free memory there, or shut down a "
            "kernel you no longer need."
        )

    hint = FREE_HINTS.get(framework, "free memory you no longer need")
    spawn = _text(doc.get("spawn_url"), 200)
    at = f" on the hub's spawn page ({spawn})" if spawn else " on the hub's spawn page"
    if isinstance(me, str):
        lines.append(f"(the hub service could not be asked: {_text(me, 200)})")
        lines.append(f"Way out: {hint}, or start this server again with a larger slice{at}.")
        return "\n".join(lines)

    neighbours = allocation.get("neighbours")
    count = _count(neighbours.get("count")) if isinstance(neighbours, dict) else None
    if isinstance(neighbours, dict) and count is not None:
        if count == 0:
            lines.append("No other server holds a slice of this card.")
        else:
            others = f"The card's other holders: {count} server{'s' if count != 1 else ''}"
            units = _count(neighbours.get("units"))
            if units is not None:
                others += f" with {units} {unit} of slices in all"
            others_used = _count(neighbours.get("used_mib"))
            others += f", using {_size(others_used * MIB)} now." if others_used is not None else "."
            lines.append(others)
    else:
        lines.append("(the hub service did not say who else holds this card)")

    larger = doc.get("larger_free")
    if isinstance(larger, list):
        names = [_text(s.get("display_name")) or _text(s.get("slug")) for s in larger if isinstance(s, dict)]
        names = [n for n in names if n]
        if names:
            also = f" (also: {', '.join(names[1:4])})" if len(names) > 1 else ""
            lines.append(
                f"Way out: {hint}, or start this server again with a larger slice that is free now: "
                f"{names[0]}{also}{at}."
            )
        else:
            lines.append(f"Way out: {hint}; no larger slice is free now (try again later{at}).")
    else:
        lines.append(f"Way out: {hint}, or start this server again with a larger slice{at}.")
    return "\n".join(lines)
