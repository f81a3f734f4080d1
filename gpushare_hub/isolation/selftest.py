"""``gpushare-selftest``: does this notebook's GPU slice hold, and how hard?

Run inside a container that holds a slice (``GPUSHARE_MEMORY_LIMIT_MIB`` set by the device
plugin's Allocate)::

    gpushare-selftest              # a short table and a verdict
    gpushare-selftest --json       # the same as JSON, with stable keys (below)
    gpushare-selftest --step-mib 128

For each GPU framework that is installed (PyTorch, then CuPy and JAX; found without importing
them here), a child Python (this interpreter, this environment, so the start-up hook applies)
allocates in steps until something stops it, never past the slice plus 1 GiB:

1. as the notebook would, with the framework's own cap in place: did it stop at the slice?
2. with the framework's own cap lifted (PyTorch's per-process fraction set to 1.0, CuPy's pool
   limit and JAX's memory fraction removed): if it still stops at the slice, a hard cap holds
   (MPS or the driver, by which of their settings the container has); if it gets past, the
   slice is held only cooperatively; if nothing stopped the first run either, not at all.

JSON (``--json``)::

    {"slice_mib": 5120, "card": "GPU-...", "claimed_tier": "cooperative" | null,
     "observed_tier": "cooperative" | "mps" | "driver" | "none" | "unknown", "ok": true,
     "frameworks": [{"name": "torch", "held": true, "stopped_at_mib": 5120, "cap": "framework",
                     "hard_cap_held": false, "error": null, ...}],
     "checked": "2026-01-01T00:00:00Z", ...}

``cap`` names what stopped the first run at the slice: ``framework`` (its own cap), ``mps`` or
``driver``; ``ok`` is whether the observed tier meets the claimed one (``GPUSHARE_ISOLATION_TIER``,
cooperative when unset). Exit status: 0 ok, 1 not ok, 2 no slice here (or a bad option).

The verdicts (:func:`framework_result`, :func:`observed_tier`, :func:`meets`, :func:`document`,
:func:`render`) are pure; only :func:`probe` and :func:`main` run anything.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from gpushare_hub.core.isolation import COOPERATIVE, DRIVER, MPS, TIERS
from gpushare_hub.isolation.probes import Probe as Probe
from gpushare_hub.isolation.probes import WholeServer, probe, whole_server

SLICE_VAR = "GPUSHARE_MEMORY_LIMIT_MIB"
TIER_VAR = "GPUSHARE_ISOLATION_TIER"
MPS_VAR = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
DRIVER_VAR = "NVIDIA_GPU_MEMORY_LIMITS"
CARD_VARS = ("GPUSHARE_CARD_UUIDS", "NVIDIA_VISIBLE_DEVICES")  # ours first: "void" in CDI mode

FRAMEWORKS = ("torch", "cupy", "jax")
NAMES = {"torch": "PyTorch", "cupy": "CuPy", "jax": "JAX"}
NONE, UNKNOWN = "none", "unknown"
RANK = {NONE: 0, COOPERATIVE: 1, MPS: 2, DRIVER: 2}
BEYOND_SLICE_MIB = 1024  # the most any child takes past the slice
DEFAULT_STEP_MIB = 256


class NoSlice(Exception):
    """This process has no GPU slice to test."""


@dataclass(frozen=True)
class FrameworkResult:
    name: str
    held: bool  # the first run stopped at or below the slice
    stopped_at_mib: int | None  # what the first run held when it stopped (None: nothing stopped it)
    cap: str | None  # what stopped it: "framework", "mps", "driver"; None where nothing held
    hard_cap_held: bool | None  # with the framework's cap lifted it still stopped (None: cannot tell)
    error: str | None = None  # why it could not be tried (then the fields above say nothing)
    lifted_stopped_at_mib: int | None = None  # the second run (None: not run, or nothing stopped it)
    note: str | None = None

    @property
    def tier(self) -> str | None:
        """The tier this framework showed; None where it could not be tried."""
        if self.error is not None:
            return None
        if not self.held:
            return NONE
        if self.hard_cap_held and self.cap in (MPS, DRIVER):
            return self.cap
        return COOPERATIVE


def hard_tier(env: Mapping[str, str]) -> str | None:
    """The hard cap this container is set up for: the claimed tier if hard, else by its settings."""
    claimed = env.get(TIER_VAR, "").strip().lower()
    if claimed in (MPS, DRIVER):
        return claimed
    if env.get(MPS_VAR, "").strip():
        return MPS
    # NVIDIA_GPU_MEMORY_LIMITS alone says nothing here: Allocate sets it only where the node claims
    # the driver tier, and a pod may set it itself.
    return None


def claimed_tier(env: Mapping[str, str]) -> str | None:
    claimed = env.get(TIER_VAR, "").strip().lower()
    return claimed if claimed in TIERS else None


def framework_result(
    name: str, slice_mib: int, capped: Probe, lifted: Probe | None, hard: str | None
) -> FrameworkResult:
    """What the two runs of one framework show."""
    if capped.error is not None:
        return FrameworkResult(name, False, None, None, None, error=capped.error)
    if not capped.stopped or capped.held_mib > slice_mib:
        # Nothing stopped it at the slice, so no hard cap did either.
        stopped = capped.held_mib if capped.stopped else None
        return FrameworkResult(name, False, stopped, None, False)
    at = capped.held_mib
    if lifted is None:
        return FrameworkResult(name, True, at, "framework", None)
    if lifted.error is not None:
        return FrameworkResult(
            name, True, at, "framework", None, note=f"with the cap lifted the run failed: {lifted.error}"
        )
    lifted_at = lifted.held_mib if lifted.stopped else None
    if lifted_at is not None and lifted_at <= slice_mib:
        if hard is not None:
            return FrameworkResult(name, True, at, hard, True, lifted_stopped_at_mib=lifted_at)
        return FrameworkResult(
            name,
            True,
            at,
            "framework",
            None,
            lifted_stopped_at_mib=lifted_at,
            note=(
                f"with {NAMES.get(name, name)}'s cap lifted it still stopped at {lifted_at} MiB, but this "
                "container has no hard cap set up (no MPS limit, no driver limit): the card may be full; "
                "counted as cooperative"
            ),
        )
    return FrameworkResult(name, True, at, "framework", False, lifted_stopped_at_mib=lifted_at)


def observed_tier(results: Sequence[FrameworkResult]) -> str:
    """The weakest tier any framework showed (one framework that gets past the slice is enough to
    break it); ``unknown`` when none could be tried."""
    tiers = [r.tier for r in results if r.tier is not None]
    if not tiers:
        return UNKNOWN
    return min(tiers, key=lambda t: RANK[t])


def meets(observed: str, claimed: str | None) -> bool:
    """Whether the observed tier holds what the node claims (cooperative when it claims nothing)."""
    if observed not in RANK or observed == NONE:
        return False
    if claimed is None or claimed == COOPERATIVE:
        return True
    return observed == claimed


def document(
    slice_mib: int,
    env: Mapping[str, str],
    results: Sequence[FrameworkResult],
    checked: datetime,
    step_mib: int = DEFAULT_STEP_MIB,
    layer: str = "",
    whole: WholeServer | None = None,
) -> dict[str, Any]:
    """The JSON report (``--json``); ``layer``: the GPU layer found missing, if one is; ``whole``:
    the check that the slice holds for the whole server (None: the caps are per process here)."""
    claimed = claimed_tier(env)
    observed = observed_tier(results)
    notes = []
    raw_claim = env.get(TIER_VAR, "").strip()
    if raw_claim and claimed is None:
        notes.append(f"{TIER_VAR}={raw_claim[:40]!r} is not a tier ({', '.join(TIERS)}); taken as unset")
    if not results:
        notes.append("no GPU framework (torch, cupy, jax) can be imported here: nothing was tried")
    if layer:
        notes.append(layer)
    card = next((env[v] for v in CARD_VARS if env.get(v)), "").split(",")[0].strip() or None
    return {
        "slice_mib": slice_mib,
        "card": card,
        "claimed_tier": claimed,
        "observed_tier": observed,
        "ok": meets(observed, claimed) and (whole is None or whole.error is not None or whole.held),
        "whole_server": None if whole is None else {**asdict(whole), "held": whole.held},
        "frameworks": [{**asdict(r), "tier": r.tier} for r in results],
        "checked": checked.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "step_mib": step_mib,
        "max_mib": slice_mib + BEYOND_SLICE_MIB,
        "notes": notes,
    }


def _verdict(doc: Mapping[str, Any]) -> str:
    observed, claimed = doc["observed_tier"], doc["claimed_tier"]
    claim = f"claimed {claimed}" if claimed else "no tier claimed (cooperative expected)"
    what = {
        COOPERATIVE: "each framework stops at the slice, but code that lifts its own cap gets past it",
        MPS: "the MPS pinned-memory limit stops every allocation at the slice",
        DRIVER: "the driver's memory limit stops every allocation at the slice",
        NONE: "nothing stops an allocation at the slice",
        UNKNOWN: "nothing could be tried",
    }[observed]
    return f"verdict: {'OK' if doc['ok'] else 'NOT OK'}: observed {observed}, {claim}: {what}."


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value} MiB"


def render(doc: Mapping[str, Any]) -> str:
    """The human report: a line about the slice, one row per framework, the verdict."""
    card = f" on {doc['card']}" if doc.get("card") else ""
    lines = [f"gpushare-selftest: {doc['slice_mib']} MiB slice{card}; tried up to {doc['max_mib']} MiB"]
    rows = [("framework", "held", "stopped at", "cap", "cap lifted: stopped at")]
    for f in doc["frameworks"]:
        if f["error"] is not None:
            rows.append((f["name"], "?", "-", "-", f"not tried: {f['error']}"))
            continue
        if not f["held"] or (f["hard_cap_held"] is None and f["lifted_stopped_at_mib"] is None):
            lifted = "-"
        elif f["lifted_stopped_at_mib"] is None:
            lifted = "went past the slice"
        else:
            lifted = _mib(f["lifted_stopped_at_mib"])
        rows.append(
            (f["name"], "yes" if f["held"] else "NO", _mib(f["stopped_at_mib"]), f["cap"] or "-", lifted)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[4])
    whole = doc.get("whole_server")
    if whole:
        lines.append(
            WholeServer(
                *(whole[k] for k in ("slice_mib", "first_mib", "second_stopped_at_mib", "error"))
            ).words()
        )
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    lines += [f"note: {f['name']}: {f['note']}" for f in doc["frameworks"] if f.get("note")]
    lines.append(_verdict(doc))
    return "\n".join(lines)


# ---- what runs ---------------------------------------------------------------------------------
def slice_from(env: Mapping[str, str]) -> int:
    raw = env.get(SLICE_VAR, "").strip()
    if not raw:
        raise NoSlice(
            f"{SLICE_VAR} is not set: this process holds no GPU slice. Run gpushare-selftest inside a "
            "notebook server (or container) that got a slice from gpushare-hub's device plugin."
        )
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise NoSlice(
            f"{SLICE_VAR}={raw[:40]!r} is not a whole number of MiB above 0; the slice cannot be read"
        )
    return value


def installed_frameworks(cwd: str | None = None) -> list[str]:
    """The frameworks the children can import, without importing them here: on this path, or in
    the working directory (first on the path of ``python -c``, which the children run)."""
    found = []
    for name in FRAMEWORKS:
        spec = None
        with contextlib.suppress(ImportError, ValueError):  # a broken or half-imported package
            spec = importlib.util.find_spec(name)
        if spec is None:
            spec = importlib.machinery.PathFinder.find_spec(name, [cwd or os.getcwd()])
        if spec is not None:
            found.append(name)
    return found


def run(slice_mib: int, step_mib: int, env: Mapping[str, str]) -> list[FrameworkResult]:
    limit = slice_mib + BEYOND_SLICE_MIB
    hard = hard_tier(env)
    results = []
    for name in installed_frameworks():
        capped = probe(name, limit, step_mib, False, env)
        held = capped.error is None and capped.stopped and capped.held_mib <= slice_mib
        lifted = probe(name, limit, step_mib, True, env) if held else None
        results.append(framework_result(name, slice_mib, capped, lifted, hard))
    return results


def _step(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB") from None
    if not 1 <= value <= 65536:
        raise argparse.ArgumentTypeError(f"{value} MiB: give a step from 1 to 65536 MiB")
    return value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gpushare-selftest",
        description="Check that this notebook's GPU slice holds: allocate past it with each installed "
        "framework, with and without the framework's own cap.",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (stable keys)")
    p.add_argument(
        "--step-mib",
        type=_step,
        default=DEFAULT_STEP_MIB,
        help=f"allocation step (default {DEFAULT_STEP_MIB})",
    )
    args = p.parse_args(argv)
    env = dict(os.environ)
    try:
        slice_mib = slice_from(env)
    except NoSlice as err:
        print(f"gpushare-selftest: {err}", file=sys.stderr)
        return 2
    from .gpulayers import missing_layer

    results = run(slice_mib, args.step_mib, env)
    # Where no framework reached the GPU, say which layer below them is missing.
    layer = missing_layer() if all(r.error is not None for r in results) else ""
    torch_held = any(r.name == "torch" and r.held for r in results)
    whole = whole_server(slice_mib, args.step_mib, env, BEYOND_SLICE_MIB) if torch_held else None
    doc = document(slice_mib, env, results, datetime.now(UTC), args.step_mib, layer, whole)
    print(json.dumps(doc, indent=1) if args.json else render(doc))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
