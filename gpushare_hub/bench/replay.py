"""``gpushare-bench replay``: every policy on the default trace, dynamic (T4 with 15 and 16
slices, compress 20) and static (trace node list, milli units, ``--seeds``
seeds), with each figure's published or computed baseline beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import time
from typing import Any

from ..replay.cli import main as replay_main
from .args import at_least_one

# Baselines measured elsewhere, printed beside our figures (see docs/measurements/2026-11-21-packing.md).
PUBLISHED_STATIC = {"best-fit (FGD paper)": 7.14, "fgd (FGD paper)": 4.77}


def _replay(*argv: str) -> dict[str, Any]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = replay_main([*argv, "--json"])
    if rc != 0:
        raise SystemExit(f"gpushare-replay {' '.join(argv)} failed with exit {rc}")
    result: dict[str, Any] = json.loads(buf.getvalue())
    return result


def bench_replay(seeds: int, policies: list[str], pods: str | None) -> dict[str, Any]:
    extra = ["--pods", pods] if pods else []
    dynamic: dict[str, Any] = {}
    for slices in (15, 16):
        for policy in policies:
            r = _replay(
                "--mode",
                "dynamic",
                "--policy",
                policy,
                "--slices-per-card",
                str(slices),
                "--compress",
                "20",
                *extra,
            )
            dynamic[f"{policy}_s{slices}"] = {
                k: r[k]
                for k in (
                    "peak_cards",
                    "peak_lower_bound",
                    "peak_ratio",
                    "card_hours_ratio",
                    "rounding_overhead_pct",
                    "failed_pods",
                    "seconds",
                )
            }
    static: dict[str, Any] = {}
    for policy in policies:
        r = _replay("--mode", "static", "--policy", policy, "--seeds", str(seeds), *extra)
        static[policy] = {
            k: r[k]
            for k in (
                "unallocated_gpu_pct_at_100",
                "unallocated_gpu_pct_at_100_per_seed",
                "failed_pods",
                "pods",
                "seconds",
            )
        }
    binpack15 = dynamic.get("binpack_s15", {}).get("peak_ratio")
    return {
        "dynamic": dynamic,
        "static": static,
        "static_baselines_pct": PUBLISHED_STATIC,
        "binpack_peak_ratio_s15": binpack15,
        "spread_over_binpack_peak_cards_s15": (
            round(dynamic["spread_s15"]["peak_cards"] / dynamic["binpack_s15"]["peak_cards"], 3)
            if "spread_s15" in dynamic and "binpack_s15" in dynamic
            else None
        ),
    }


def add_parser(sub: Any) -> None:
    rp = sub.add_parser("replay", help="packing quality of every policy on the trace")
    rp.add_argument("--seeds", type=at_least_one, default=10, help="static-mode seeds (the paper uses 10)")
    rp.add_argument("--policies", nargs="+", default=["binpack", "spread", "fgd", "strand"])
    rp.add_argument("--pods", default=None, help="pod list CSV (default: the trace's default list)")
    rp.add_argument("--json", action="store_true", help="print one JSON object")
    rp.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    out = bench_replay(args.seeds, args.policies, args.pods)
    out["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(out))
        return 0
    print("dynamic (sharing pods, compress 20): peak cards / L2 bound, card-hours ratio")
    for name, r in out["dynamic"].items():
        print(
            f"  {name:14s} {r['peak_cards']:4d} / {r['peak_lower_bound']:4d} = {r['peak_ratio']:.4f}"
            f"   card-hours x{r['card_hours_ratio']:.4f}"
        )
    print(f"static (trace nodes, milli, {args.seeds} seed(s)): unallocated GPU % at arrived = 100%")
    for name, r in out["static"].items():
        print(f"  {name:14s} {r['unallocated_gpu_pct_at_100']:.3f}%   failed pods {r['failed_pods']}")
    for name, v in PUBLISHED_STATIC.items():
        print(f"  {name:22s} {v:.2f}% (published baseline)")
    print(f"took {out['seconds']} s")
    return 0
