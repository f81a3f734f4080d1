"""``gpushare-replay``: how many cards would this trace need, and how close is that to the optimum?

Examples::

    gpushare-replay                                   # dynamic, sharing pods, 200x2 T4, compress 20
    gpushare-replay --policy spread --json
    gpushare-replay --mode static --seeds 10 --json   # FGD's experiment on the trace node list
    gpushare-replay --plot replay.png
    gpushare-replay --compare-dra                     # binpack beside Kubernetes' DRA allocator
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from ..core.drapacking import DRA_POLICIES, HostCapacity, make_dra_policy
from ..core.fragmentation import Shape
from ..core.ledger import Ledger
from ..core.policy import POLICIES, Placer, Policy
from ..core.targets import make_policy_for
from . import compare, hibernate, whatif
from .cluster import (
    Units,
    choose_units,
    ledger_from_groups,
    ledger_from_trace,
    parse_cards,
    parse_catalogue,
)
from .simulate import DynamicResult, StaticResult, run_dynamic, run_static, select
from .trace import KNOWN_MODELS, TraceError, TracePod, check_specs, read_nodes, read_pods

DEFAULT_CARDS = "200x2 Tesla-T4:15360"


def default_trace_dir() -> Path:
    """$GPUSHARE_TRACE_DIR, else ``shared/data/alibaba-gpu-2023`` beside or inside the checkout."""
    env = os.environ.get("GPUSHARE_TRACE_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for root in [Path.cwd(), *here.parents]:
        for cand in (root / "shared", root.parent / "shared"):
            d = cand / "data" / "alibaba-gpu-2023"
            if d.is_dir():
                return d
    return Path("shared/data/alibaba-gpu-2023")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpushare-replay",
        description="Replay a GPU-sharing pod trace (Alibaba cluster-trace-gpu-v2023 format) "
        "with gpushare-hub's placement policies and compare the cards used with a lower bound.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    trace = default_trace_dir()
    p.add_argument(
        "--pods",
        type=Path,
        default=None,
        help=f"pod list CSV (default: {trace / 'openb_pod_list_default.csv'})",
    )
    p.add_argument(
        "--mode",
        choices=("dynamic", "static"),
        default="dynamic",
        help="dynamic: arrivals and departures; static: FGD-style fill-up, no departures",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--nodes",
        type=Path,
        default=None,
        help=f"the trace's node list CSV (default in static mode: {trace / 'openb_node_list_gpu_node.csv'})",
    )
    where.add_argument(
        "--cards",
        default=None,
        help=f"a declared cluster, NODESxCARDS MODEL[:MiB][, ...] (default in dynamic "
        f"mode: '{DEFAULT_CARDS}')",
    )
    p.add_argument(
        "--select",
        choices=("sharing", "gpu", "all"),
        default=None,
        help="which pods to replay (default: sharing in dynamic mode, all in static mode)",
    )
    p.add_argument(
        "--unit",
        choices=("slices", "milli"),
        default=None,
        help="count GPU in slices of a card (ceil rounding) or in the trace's gpu_milli "
        "(default: slices in dynamic mode, milli in static mode)",
    )
    p.add_argument(
        "--slices-per-card",
        type=int,
        default=None,
        help="slices per card (default: the card's MiB // 1024, 15 for a T4)",
    )
    p.add_argument(
        "--catalogue",
        type=parse_catalogue_arg,
        default=(),
        metavar="S1,S2,...",
        help="slice sizes a spawn page offers, in slices (GiB on a T4 with the default S), e.g. "
        "3,5,7: each sharing pod gets the smallest size that holds its exact slices, a pod above "
        "the largest a whole card (default: every pod its exact slices; '15' on a T4: whole cards)",
    )
    p.add_argument(
        "--policy",
        choices=sorted({*POLICIES, *DRA_POLICIES}),
        default="binpack",
        help="placement policy (dra-*: Kubernetes' DRA allocator with the default scheduler, "
        "see docs/reference/replay.md)",
    )
    p.add_argument("--compress", type=float, default=20.0, help="dynamic: divide arrival times by K")
    p.add_argument("--inflate", type=float, default=1.3, help="static: fill up to this share of capacity")
    p.add_argument("--seed", type=int, default=0, help="static: shuffle seed (first seed with --seeds)")
    p.add_argument("--seeds", type=int, default=1, help="static: run this many seeds and report the mean")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG plot here (needs matplotlib)")
    compare.add_arguments(p)
    whatif.add_arguments(p)
    hibernate.add_arguments(p)
    return p


def _policy(
    name: str, pods: list[TracePod], units: Units, ledger: Ledger, hosts: dict[str, HostCapacity]
) -> Policy:
    # The DRA policies score nodes on the CPU and memory the pods request (the nodes' own, else
    # ``hosts``, else a nominal T4 node).
    if name in DRA_POLICIES:
        return make_dra_policy(name, ledger, hosts)
    # The target workload of fgd, strand and fgd-sim is the trace's own mix of task shapes
    # (as in the FGD paper).
    return make_policy_for(name, (Shape.of(units.demand(p, p.name)) for p in pods))


def parse_catalogue_arg(spec: str) -> tuple[int, ...]:
    try:
        return parse_catalogue(spec)
    except TraceError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--catalogue: ")) from err


def rounding_overhead_pct(pods: list[TracePod], units: Units) -> float:
    """How much rounding to slices (and up to the catalogue) adds to the sharing pods' total demand."""
    sharing = [p for p in pods if p.sharing]
    if units.mode == "milli" or not sharing:
        return 0.0
    asked = sum(p.gpu_milli for p in sharing)
    given = sum((units.sharing_units(p.gpu_milli) or units.per_card) * 1000 / units.per_card for p in sharing)
    return 100 * (given - asked) / asked


def share_of_used_cards_pct(unit_hours: float, r: DynamicResult, units: Units, idle: bool = False) -> float:
    """``unit_hours`` as a share of the memory of the cards in use, weighted by time; ``idle``:
    the rest (with held unit-hours: memory of cards in use that no pod holds, i.e. fragments)."""
    capacity_hours = r.card_hours * units.per_card
    if not capacity_hours:
        return 0.0
    share = 100 * unit_hours / capacity_hours
    return max(0.0, 100 - share) if idle else share


def _dynamic(args: argparse.Namespace, pods: list[TracePod]) -> tuple[dict[str, Any], DynamicResult]:
    if args.nodes is not None:
        nodes = read_nodes(args.nodes)
        units = choose_units(
            args.unit or "slices",
            args.slices_per_card,
            {KNOWN_MODELS.get(n.model) for n in nodes},
            args.catalogue,
        )
        ledger = ledger_from_trace(nodes, units, host=False)
        hosts = {n.name: HostCapacity(n.cpu_milli, n.memory_mib) for n in nodes}
    else:
        groups = parse_cards(args.cards or DEFAULT_CARDS)
        units = choose_units(
            args.unit or "slices", args.slices_per_card, {g.mib for g in groups}, args.catalogue
        )
        ledger = ledger_from_groups(groups, units)
        hosts = {}
    check_specs(args.pods, pods, {c.model for n in ledger.nodes() for c in n.cards})
    chosen = select(pods, args.select or "sharing")
    placer = Placer(ledger, _policy(args.policy, chosen, units, ledger, hosts))
    r = run_dynamic(chosen, ledger, units, placer, args.compress, str(args.pods))
    out = {
        "mode": "dynamic",
        "policy": args.policy,
        "unit": units.mode,
        "units_per_card": units.per_card,
        "compress": args.compress,
        "catalogue": list(units.catalogue),
        "select": args.select or "sharing",
        "rounding_overhead_pct": round(rounding_overhead_pct(chosen, units), 2),
        "pods": r.pods,
        "placed": r.placed,
        "skipped_zero_duration": r.skipped,
        "failed_pods": r.failures.count,
        "failed_reasons": r.failures.as_json(),
        "peak_cards": r.peak_cards,
        "peak_lower_bound": r.peak_lower_bound,
        "peak_ratio": round(r.peak_ratio, 4),
        "card_hours_ratio": round(r.card_hours_ratio, 4),
        "card_hours": round(r.card_hours, 1),
        "lower_bound_card_hours": round(r.lower_bound_hours, 1),
        "idle_in_used_cards_pct": round(share_of_used_cards_pct(r.held_unit_hours, r, units, idle=True), 2),
        "asked_in_used_cards_pct": round(share_of_used_cards_pct(r.asked_unit_hours, r, units), 2),
    }
    return out, r


def _static(args: argparse.Namespace, pods: list[TracePod]) -> tuple[dict[str, Any], list[StaticResult]]:
    node_file = args.nodes or default_trace_dir() / "openb_node_list_gpu_node.csv"
    if args.cards is not None:
        raise TraceError("--mode static needs the trace's node list (CPU and memory per node), not --cards")
    nodes = read_nodes(node_file)
    units = choose_units(
        args.unit or "milli", args.slices_per_card, {KNOWN_MODELS.get(n.model) for n in nodes}, args.catalogue
    )
    check_specs(args.pods, pods, {n.model for n in nodes})
    chosen = select(pods, args.select or "all")
    if args.seeds < 1:
        raise TraceError(f"--seeds must be at least 1, got {args.seeds}")
    runs = []
    for seed in range(args.seed, args.seed + args.seeds):
        ledger = ledger_from_trace(nodes, units, host=True)
        placer = Placer(ledger, _policy(args.policy, chosen, units, ledger, {}))
        runs.append(run_static(chosen, ledger, units, placer, seed, args.inflate))
    pct = [r.unallocated_gpu_pct_at_100 for r in runs]
    out = {
        "mode": "static",
        "policy": args.policy,
        "unit": units.mode,
        "units_per_card": units.per_card,
        "select": args.select or "all",
        "inflate": args.inflate,
        "catalogue": list(units.catalogue),
        "seeds": [r.seed for r in runs],
        "nodes": len(nodes),
        "gpus": sum(n.gpus for n in nodes),
        "rounding_overhead_pct": round(rounding_overhead_pct(chosen, units), 2),
        "pods": round(statistics.mean(r.pods for r in runs)),
        "unallocated_gpu_pct_at_100": round(statistics.mean(pct), 3),
        "unallocated_gpu_pct_at_100_per_seed": [round(x, 3) for x in pct],
        "unallocated_gpu_pct_at_end": round(statistics.mean(r.unallocated_gpu_pct_at_end for r in runs), 3),
        "failed_pods": round(statistics.mean(r.failed_at_100 for r in runs), 1),
        "failed_pods_at_end": round(statistics.mean(r.failures.count for r in runs), 1),
        "failed_reasons": runs[0].failures.as_json(),
    }
    return out, runs


def _report(out: dict[str, Any]) -> str:
    lines = [
        f"gpushare-replay: {out['mode']} mode, policy {out['policy']}, "
        f"{out['unit']} ({out['units_per_card']} per card)"
    ]
    if out["catalogue"]:
        sizes = ", ".join(map(str, out["catalogue"]))
        lines.append(f"  catalogue       {sizes} slices; larger pods: a whole card")
    if out["unit"] == "slices":
        lines.append(f"  rounding adds {out['rounding_overhead_pct']}% to sharing pods' demand")
    if out["mode"] == "dynamic":
        lines += [
            f"  pods replayed   {out['pods']} ({out['placed']} placed, {out['failed_pods']} failed, "
            f"{out['skipped_zero_duration']} of zero duration skipped), "
            f"arrivals compressed {out['compress']}x",
            f"  peak cards used {out['peak_cards']}   lower bound (L2) at peak {out['peak_lower_bound']}   "
            f"ratio {out['peak_ratio']}",
            f"  card-hours      {out['card_hours']} vs bound {out['lower_bound_card_hours']}   "
            f"ratio {out['card_hours_ratio']}",
            f"  cards in use: {out['idle_in_used_cards_pct']}% of their memory held by no pod, "
            f"{out['asked_in_used_cards_pct']}% asked by the pods (exact slices; time-weighted)",
        ]
    else:
        lines += [
            f"  cluster         {out['nodes']} nodes, {out['gpus']} GPUs; inflate {out['inflate']}, "
            f"seeds {out['seeds']}",
            f"  unallocated GPU at arrived=100%  {out['unallocated_gpu_pct_at_100']}%   "
            f"(at {int(out['inflate'] * 100)}%: {out['unallocated_gpu_pct_at_end']}%)",
            f"  failed pods     {out['failed_pods']} by 100%, {out['failed_pods_at_end']} by the end",
        ]
    for kind, n in out["failed_reasons"]["by_reason"].items():
        lines.append(f"    {n} x {kind}: e.g. {out['failed_reasons']['examples'][kind]}")
    lines.append(f"  took {out['seconds']} s")
    return "\n".join(lines)


def _plot(path: Path, out: dict[str, Any], data: DynamicResult | list[StaticResult]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise TraceError("--plot needs matplotlib: pip install 'gpushare-hub[plot]'") from err
    if isinstance(data, DynamicResult):
        fig, (full, ax) = plt.subplots(2, 1, figsize=(9, 7), dpi=110, height_ratios=[1, 2])
        hours = [t / 3600 for t in data.times]
        for axis in (full, ax):
            axis.step(hours, data.cards, where="post", label=f"cards used ({out['policy']})", lw=1)
            axis.step(
                hours, data.bounds, where="post", label="lower bound (Martello-Toth L2)", lw=1, alpha=0.8
            )
            axis.grid(alpha=0.3)
            axis.set_ylabel("cards")
        # Zoom on the busy stretch: where at least a quarter of the peak is in use.
        busy = [h for h, c in zip(hours, data.cards, strict=True) if c >= 0.25 * max(data.cards or [0])]
        if busy:
            pad = 0.1 * (busy[-1] - busy[0]) or 1.0
            ax.set_xlim(busy[0] - pad, busy[-1] + pad)
            full.axvspan(busy[0] - pad, busy[-1] + pad, color="grey", alpha=0.15)
        full.set_title(
            f"peak {out['peak_cards']} cards vs bound {out['peak_lower_bound']} "
            f"(x{out['peak_ratio']}); card-hours x{out['card_hours_ratio']}"
        )
        ax.set_xlabel(f"replay time, hours (arrivals compressed {out['compress']}x); below: the busy stretch")
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    for r in data:
        ax.plot(r.arrived_pct, r.allocated_pct, lw=0.8, label=f"seed {r.seed}")
    top = 100 * out["inflate"]
    ax.plot([0, top], [0, top], ls=":", color="grey", label="everything placed")
    ax.axvline(100, color="grey", lw=0.5)
    ax.set_xlabel("arrived GPU demand, % of capacity")
    ax.set_ylabel("allocated GPU, % of capacity")
    ax.set_title(f"{out['policy']}: {out['unallocated_gpu_pct_at_100']}% unallocated at arrived=100%")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_path(path: Path) -> Path:
    """Where ``--plot`` writes (matplotlib adds ``.png`` to a name without a suffix)."""
    path = path if path.suffix else path.with_suffix(".png")
    folder = path.parent
    if not folder.is_dir():
        raise TraceError(f"--plot {path}: folder {folder} does not exist; create it or give another path")
    if path.is_dir() or not os.access(folder, os.W_OK):
        raise TraceError(f"--plot {path}: cannot write there; give a file path in a folder you can write")
    return path


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.perf_counter()
    try:
        if args.plot:  # checked before the replay, whose figures would be lost at the end
            args.plot = _plot_path(args.plot)
        if whatif.wanted(args):
            return _history(args, build_parser().parse_args([]))
        if args.sweep:
            raise TraceError("--sweep replays the hub's history: give --history FILE or --hub-url")
        hibernate.refuse_without_history(args)
        if args.compare_dra:
            compare.check_options(args, build_parser().parse_args([]))
        args.pods = args.pods or default_trace_dir() / "openb_pod_list_default.csv"
        pods = read_pods(args.pods)
        if args.compare_dra:
            out = compare.run(args, partial(_one_policy, args, pods), DEFAULT_CARDS)
        elif args.mode == "dynamic":
            out, data = _dynamic(args, pods)
        else:
            out, data = _static(args, pods)  # type: ignore[assignment]
        out["seconds"] = round(time.perf_counter() - started, 2)
        if args.plot:
            _plot(args.plot, out, data)
            out["plot"] = str(args.plot)
    except TraceError as err:
        print(f"gpushare-replay: error: {err}", file=sys.stderr)
        return 2
    if args.compare_dra:
        print(json.dumps(out) if args.json else compare.report(out))
    else:
        print(json.dumps(out, indent=None if args.json else 2) if args.json else _report(out))
    return 0


def _one_policy(args: argparse.Namespace, pods: list[TracePod], policy: str) -> dict[str, Any]:
    return _dynamic(compare.with_policy(args, policy), pods)[0]


def _history(args: argparse.Namespace, defaults: argparse.Namespace) -> int:
    compare.check_history(args)
    out, single = whatif.run(args, defaults)
    if args.plot:
        whatif.plot(args.plot, out, single)
        out["plot"] = str(args.plot)
    print(json.dumps(out) if args.json else whatif.report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
