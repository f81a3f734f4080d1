"""``gpushare-replay --compare-dra``: binpack beside what Kubernetes' own device allocation (DRA)
would do with the same pods, one dynamic replay per policy, in one table against the L2 bound.

The policies are :mod:`~gpushare_hub.core.drapacking`'s: ``dra-first-fit`` (the allocator's first
fit, cards in index order, the default scheduler's node choice), ``dra-ordered`` (the driver
lists the fullest card first) and ``dra-ordered-binpack`` (plus binpack's node scoring as a
prioritize-only extender). The last row is the chosen DRA packing (:data:`CHOSEN`).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..core.drapacking import DRA_POLICIES
from .trace import TraceError

# The rows, in order: our default, then the DRA policies (plain first fit first).
COMPARED = ("binpack", *DRA_POLICIES)
# The DRA packing the docs recommend, chosen on the figures of
# docs/measurements/2026-11-28-dra-packing.md.
CHOSEN = "dra-ordered-binpack"
ROW_KEYS = ("peak_cards", "peak_lower_bound", "peak_ratio", "card_hours_ratio", "failed_pods")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compare-dra",
        action="store_true",
        help=f"dynamic: replay with {', '.join(COMPARED)} and print one table of peak cards against "
        "the L2 bound and failed pods (Kubernetes' DRA allocator beside binpack)",
    )


def check_options(args: argparse.Namespace, defaults: argparse.Namespace) -> None:
    """Refuse what the comparison cannot honour, before anything runs."""
    if args.mode != "dynamic":
        raise TraceError("--compare-dra compares peak cards in a dynamic replay; leave out --mode static")
    if args.policy != defaults.policy:
        raise TraceError(f"--compare-dra replays {', '.join(COMPARED)} itself; leave out --policy")
    if args.plot is not None:
        raise TraceError("--plot draws one policy's replay; leave it out with --compare-dra")


def check_history(args: argparse.Namespace) -> None:
    if args.compare_dra or args.policy in DRA_POLICIES:
        raise TraceError(
            "--compare-dra and the dra-* policies replay the trace (they model the default "
            "scheduler's node choice on the pods' CPU and memory, which the history lacks); "
            "leave them out with --history or --hub-url"
        )


def with_policy(args: argparse.Namespace, policy: str) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "policy": policy})


def run(
    args: argparse.Namespace, replay_one: Callable[[str], dict[str, Any]], default_cards: str
) -> dict[str, Any]:
    """One dynamic replay per compared policy (``replay_one(policy)`` gives its JSON document)."""
    rows = []
    first: dict[str, Any] = {}
    for policy in COMPARED:
        started = time.perf_counter()
        out = replay_one(policy)
        first = first or out
        seconds = round(time.perf_counter() - started, 2)
        rows.append({"policy": policy, **{k: out[k] for k in ROW_KEYS}, "seconds": seconds})
    return {
        "mode": "compare-dra",
        "pods_file": str(args.pods),
        "cards": None if args.nodes is not None else (args.cards or default_cards),
        "nodes_file": None if args.nodes is None else str(args.nodes),
        "unit": first["unit"],
        "units_per_card": first["units_per_card"],
        "compress": first["compress"],
        "catalogue": first["catalogue"],
        "select": first["select"],
        "pods": first["pods"],
        "chosen": CHOSEN,
        "rows": rows,
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    head = ("policy", "peak cards", "L2", "vs L2", "card-h vs L2", "failed pods")
    body = [
        (
            r["policy"] + (" (chosen)" if r["policy"] == CHOSEN else ""),
            str(r["peak_cards"]),
            str(r["peak_lower_bound"]),
            f"{r['peak_ratio']:.3f}",
            f"{r['card_hours_ratio']:.3f}",
            str(r["failed_pods"]),
        )
        for r in rows
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    fmt = "  " + "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*line) for line in [head, *body])


def report(out: dict[str, Any]) -> str:
    where = out["nodes_file"] or out["cards"]
    lines = [
        f"gpushare-replay --compare-dra: {out['pods']} pods of {out['pods_file']} ({out['select']}), "
        f"on {where}, {out['unit']} ({out['units_per_card']} per card), arrivals compressed "
        f"{out['compress']}x",
        table(out["rows"]),
        "  dra-*: the DRA allocator's first fit in the slice's device order (first-fit: index order; "
        "ordered: fullest card first)",
        "  nodes: kube-scheduler's default scoring on CPU and memory (least-allocated + balanced); "
        "mostallocated: a profile scoring most-allocated; binpack: binpack's node key as a "
        "prioritize-only extender",
        f"  took {out['seconds']} s",
    ]
    return "\n".join(lines)
