"""``gpushare-replay --history FILE`` (or ``--hub-url``): the hub's own arrivals and departures
against a declared cluster, catalogue and policy (:mod:`~gpushare_hub.core.planning`), one
what-if or a ``--sweep`` of them, as a report, a table, ``--json`` and ``--plot``; with
``--hibernate-after``, each beside the same with hibernation (:mod:`.hibernate`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from ..core.planning import (
    Plan,
    PlanningError,
    Session,
    figures,
    parse_cards_range,
    parse_catalogue,
    recorded,
    replay,
    row_words,
    sweep,
    wait_words,
)
from . import hibernate
from .cluster import parse_cards
from .history import fetch_history, read_history, token_from
from .trace import KNOWN_MODELS, TraceError

# The options of the trace replay that mean nothing for a history, with what they were given.
TRACE_ONLY = {
    "pods": "--pods",
    "nodes": "--nodes",
    "unit": "--unit",
    "slices_per_card": "--slices-per-card",
    "select": "--select",
}
SWEEP_KEYS = ("cards", "catalogue", "policy")
# The share of spawns waiting an admin is shown the fewest cards for.
GOOD_ENOUGH_PCT = 5.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "the hub's history (capacity planning)",
        "Replay the hub's own spawns (api/v1/history's export) against a declared cluster: "
        "--cards, --catalogue (GiB) and --policy, or a --sweep of them.",
    )
    src = g.add_mutually_exclusive_group()
    src.add_argument(
        "--history", type=Path, default=None, metavar="FILE", help="api/v1/history's export, CSV or JSON"
    )
    src.add_argument(
        "--hub-url",
        default=None,
        metavar="URL",
        help="read the history from the hub's gpushare service (token: $JUPYTERHUB_API_TOKEN or "
        "--token-file; it needs the service's admin scope)",
    )
    g.add_argument("--token-file", type=Path, default=None, help="a file holding the token for --hub-url")
    g.add_argument(
        "--service-prefix", default="/services/gpushare/", help="where the hub serves the gpushare service"
    )
    g.add_argument(
        "--sweep",
        nargs="+",
        default=None,
        metavar="KEY=VALUES",
        help="replay every combination: cards=4..12 (or 4,6,8), catalogue='3,5,7;4,8;5,10', "
        "policy=binpack,fgd; what is not swept comes from --cards, --catalogue and --policy",
    )


def wanted(args: argparse.Namespace) -> bool:
    return args.history is not None or args.hub_url is not None


def _check_options(args: argparse.Namespace, defaults: argparse.Namespace) -> None:
    """Refuse the trace replay's options, however spelt (argparse takes abbreviations): each
    differs from its default when given."""
    given = [flag for dest, flag in TRACE_ONLY.items() if getattr(args, dest) is not None]
    given += [
        "--" + dest
        for dest in ("mode", "compress", "inflate", "seed", "seeds")
        if getattr(args, dest) != getattr(defaults, dest)
    ]
    if given:
        raise TraceError(
            f"{', '.join(given)}: an option of the trace replay; with --history or --hub-url declare "
            "the cluster with --cards, the sizes with --catalogue (GiB) and the policy with --policy"
        )
    if args.token_file is not None and args.hub_url is None:
        raise TraceError("--token-file goes with --hub-url")


def _parse_sweep(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or key not in SWEEP_KEYS or not value.strip():
            raise TraceError(
                f"--sweep {item[:60]!r}: write KEY=VALUES with KEY one of {', '.join(SWEEP_KEYS)}, e.g. "
                "cards=4..12 catalogue='3,5,7;4,8'"
            )
        if key in out:
            raise TraceError(f"--sweep names {key} twice; give each once")
        out[key] = value
    return out


def _commonest_model(sessions: Sequence[Session]) -> str:
    models = Counter(s.model for s in sessions if KNOWN_MODELS.get(s.model))
    return models.most_common(1)[0][0] if models else "Tesla-T4"


def plans(args: argparse.Namespace, sessions: Sequence[Session]) -> list[Plan]:
    """Every what-if asked for: the sweep's combinations, or the one of --cards."""
    swept = _parse_sweep(args.sweep) if args.sweep else {}
    try:
        if args.cards is not None:
            groups = parse_cards(args.cards)
            if len({(g.key, g.mib) for g in groups}) != 1 or len({g.count for g in groups}) != 1:
                raise TraceError(
                    f"--cards {args.cards!r}: the what-if takes one kind of card, e.g. '4x2 Tesla-T4'"
                )
            model, mib, per_node = groups[0].key, groups[0].mib, groups[0].count
            if mib is None:
                raise TraceError(f"--cards {args.cards!r}: say the card's memory, e.g. {model}:15360")
            counts = [sum(g.nodes * g.count for g in groups)]
        elif "cards" in swept:
            model = _commonest_model(sessions)
            mib, per_node, counts = KNOWN_MODELS[model] or 15360, 1, []
        else:
            raise TraceError(
                "--history needs a cluster to replay against: --cards '8x1 Tesla-T4', or "
                "--sweep cards=4..12 (cards of the history's model, one to a node)"
            )
        if "cards" in swept:
            counts = parse_cards_range(swept["cards"])
        catalogues = [tuple(args.catalogue)]
        if "catalogue" in swept:
            catalogues = [parse_catalogue(c) for c in swept["catalogue"].split(";") if c.strip()]
        policies = [args.policy]
        if "policy" in swept:
            policies = [p.strip() for p in swept["policy"].split(",") if p.strip()]
        out = [
            Plan(cards=n, model=model, mib=mib, per_node=per_node, catalogue=cat, policy=policy)
            for policy in policies
            for cat in catalogues
            for n in counts
        ]
    except PlanningError as err:
        raise TraceError(f"--sweep {err}" if swept else str(err)) from None
    if len(out) > 2000:
        raise TraceError(f"--sweep asks {len(out)} replays; ask for at most 2000")
    return out


def _when(when: str | None) -> str:
    return "-" if when is None else when.replace("T", " ")[:16]


def _catalogue_words(catalogue: Sequence[int]) -> str:
    return ",".join(map(str, catalogue)) + " GiB" if catalogue else "as held"


def report(out: dict[str, Any]) -> str:
    rec = out["recorded"]
    lines = [
        f"gpushare-replay: the hub's history, {rec['spawns']} spawns from {_when(rec['first'])} to "
        f"{_when(rec['last'])} UTC ({out['source']})",
    ]
    if rec["wait_recorded"]:
        pct = 100 * rec["waited"] / rec["wait_recorded"]
        lines.append(
            f"  as it was: {rec['waited']} of {rec['wait_recorded']} spawns waited ({pct:.1f}%), "
            f"median {wait_words(rec['wait_median_seconds'])}, p95 "
            f"{wait_words(rec['wait_p95_seconds'])}; at most {rec['peak_gib_held']:g} GiB held at once"
        )
    rows = out["rows"]
    if len(rows) == 1:
        r = rows[0]
        idle = (
            f", {r['idle_gib_hours']:g} of them idle on the GPU (measured for "
            f"{r['idle_measured_sessions']} of {r['spawns']} spawns)"
            if r["idle_gib_hours"] is not None
            else "; GPU use not measured"
        )
        lines += [
            f"  what-if: {r['cards']} x {r['model']} ({r['cards_per_node']} per node), slices "
            f"{_catalogue_words(r['catalogue'])}, policy {r['policy']}",
            f"  {row_words(r)}",
            f"  peak cards used {r['peak_cards']}   lower bound (L2) at peak {r['peak_lower_bound']}",
            f"  card-hours {r['card_hours']:g} vs bound {r['lower_bound_card_hours']:g}",
            f"  GiB-hours asked {r['asked_gib_hours']:g}{idle}",
        ]
        if "hibernation" in r:
            lines += hibernate.report_lines(r, out["hibernation"])
        if r["never_fits"]:
            lines.append(f"  {r['never_fits']} spawn(s) held more than a {r['model']} card holds: left out")
    else:
        lines.append(table(rows))
        lines += picks(rows)
        lines += hibernate.summary(out.get("hibernation"), rows[0]["spawns"])
    lines.append(f"  took {out['seconds']} s")
    return "\n".join(lines)


def table(rows: Sequence[dict[str, Any]]) -> str:
    head: tuple[str, ...] = (
        "policy",
        "slices",
        "cards",
        "spawns waiting",
        "median",
        "p95",
        "peak",
        "L2",
        "card-h",
        "idle GiB-h",
    )
    extra_head, extra = hibernate.table_columns(rows)
    head += extra_head
    body = [
        (
            r["policy"],
            _catalogue_words(r["catalogue"]),
            str(r["cards"]),
            f"{r['waited_pct']:.1f}% ({r['waited']})",
            wait_words(r["wait_median_seconds"]),
            wait_words(r["wait_p95_seconds"]),
            str(r["peak_cards"]),
            str(r["peak_lower_bound"]),
            f"{r['card_hours']:.0f}",
            "-" if r["idle_gib_hours"] is None else f"{r['idle_gib_hours']:.0f}",
            *more,
        )
        for r, more in zip(rows, extra, strict=True)
    ]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    fmt = "  " + "  ".join(f"{{:<{w}}}" if i < 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*line) for line in [head, *body])


def picks(rows: Sequence[dict[str, Any]]) -> list[str]:
    """For each catalogue and policy, the fewest cards where few spawns wait."""
    lines = []
    seen: list[tuple[str, tuple[int, ...]]] = []
    for r in rows:
        key = (r["policy"], tuple(r["catalogue"]))
        if key not in seen:
            seen.append(key)
    for policy, catalogue in seen:
        mine = [r for r in rows if (r["policy"], tuple(r["catalogue"])) == (policy, catalogue)]
        good = [r for r in mine if r["waited_pct"] <= GOOD_ENOUGH_PCT]
        what = f"  slices {_catalogue_words(catalogue)}, {policy}: "
        if good:
            best = min(good, key=lambda r: r["cards"])
            lines.append(what + f"fewest cards with at most {GOOD_ENOUGH_PCT:g}% waiting: {row_words(best)}")
        else:
            lines.append(
                what + f"more than {GOOD_ENOUGH_PCT:g}% of spawns wait even with {mine[-1]['cards']} cards"
            )
    return lines


def plot(path: Path, out: dict[str, Any], single: Any) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise TraceError("--plot needs matplotlib: pip install 'gpushare-hub[plot]'") from err
    rows = out["rows"]
    if len(rows) == 1:
        fig, (ax, queue) = plt.subplots(2, 1, figsize=(9, 6), dpi=110, height_ratios=[2, 1], sharex=True)
        when = [datetime.fromtimestamp(t, UTC) for t in single.times]
        ax.step(when, single.cards, where="post", lw=1, label=f"cards used ({rows[0]['policy']})")
        ax.step(when, single.bounds, where="post", lw=1, alpha=0.8, label="lower bound (Martello-Toth L2)")
        ax.axhline(rows[0]["cards"], color="grey", ls=":", label=f"{rows[0]['cards']} cards declared")
        ax.set_ylabel("cards")
        ax.legend(loc="best", fontsize=8)
        ax.set_title(row_words(rows[0]))
        queue.step(when, single.waiting, where="post", lw=1, color="tab:red")
        queue.set_ylabel("spawns waiting")
        queue.set_xlabel("time (UTC)")
        for axis in (ax, queue):
            axis.grid(alpha=0.3)
        fig.autofmt_xdate()
    else:
        fig, (share, p95) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(f"{_catalogue_words(r['catalogue'])}, {r['policy']}", []).append(r)
        for label, mine in groups.items():
            cards = [r["cards"] for r in mine]
            share.plot(cards, [r["waited_pct"] for r in mine], marker="o", lw=1, label=label)
            waits = [(r["cards"], r["wait_p95_seconds"] / 60) for r in mine if r["wait_p95_seconds"]]
            p95.plot([c for c, _ in waits], [m for _, m in waits], marker="o", lw=1, label=label)
        share.axhline(GOOD_ENOUGH_PCT, color="grey", ls=":", lw=0.8)
        share.set_xlabel("cards")
        share.set_ylabel("spawns that wait, %")
        share.set_title("How many spawns would have waited")
        p95.set_xlabel("cards")
        p95.set_yscale("log")
        p95.set_ylabel("p95 wait of those, minutes (log scale)")
        p95.set_title("How long (95th percentile)")
        for axis in (share, p95):
            axis.grid(alpha=0.3)
            axis.legend(loc="best", fontsize=8, title="slices, policy", title_fontsize=8)
        fig.suptitle(f"The hub's history, {rows[0]['spawns']} spawns, replayed on {rows[0]['model']} cards")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(args: argparse.Namespace, defaults: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The what-ifs asked for: (the JSON document, the one replay's time series or None)."""
    started = time.perf_counter()
    _check_options(args, defaults)
    if args.history is not None:
        source = str(args.history)
        sessions = read_history(args.history)
    else:
        source = args.hub_url
        sessions = fetch_history(args.hub_url, token_from(args.token_file), args.service_prefix)
    asked = plans(args, sessions)
    hibernation = hibernate.of(args)
    single = None

    def progress(done: int, total: int, plan: Plan, what: str = "") -> None:
        print(
            f"gpushare-replay: {done}/{total} {plan.cards} cards, slices "
            f"{_catalogue_words(plan.catalogue)}, {plan.policy}{what} "
            f"({time.perf_counter() - started:.1f} s)",
            file=sys.stderr,
            flush=True,
        )

    if len(asked) == 1:
        single = replay(sessions, asked[0])
        rows = [figures(sessions, single)]
    else:
        rows = sweep(sessions, asked, progress)
    out: dict[str, Any] = {"mode": "history", "source": source, "recorded": recorded(sessions), "rows": rows}
    if hibernation is not None:
        swept = None if single is not None else partial(progress, what=", with hibernation")
        hibernate.add_rows(rows, sessions, asked, hibernation, swept)
        out["hibernation"] = hibernate.document(sessions, hibernation)
    out["seconds"] = round(time.perf_counter() - started, 2)
    return out, single
