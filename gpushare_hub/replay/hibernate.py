"""``gpushare-replay --history FILE --hibernate-after MINUTES [--overcommit FACTOR]``: beside each
what-if, the same replay with idle notebooks hibernated and cards overcommitted
(:mod:`~gpushare_hub.core.hibernation_whatif`), its peak cards against its own lower bound.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import Any

from ..core.hibernation_whatif import MAX_FACTOR, Hibernation
from ..core.planning import Plan, Session, figures, replay, row_words
from .trace import TraceError

DEFAULT_FACTOR = 2.0
# The figures of the replay with hibernation each row carries under "hibernation".
ROW_KEYS = (
    "peak_cards",
    "peak_lower_bound",
    "card_hours",
    "lower_bound_card_hours",
    "waited",
    "waited_pct",
    "wait_median_seconds",
    "wait_p95_seconds",
)
MODEL = (
    "the history records each session's idle seconds, not when: they are taken as the end of "
    "the session (a notebook left open after the work), so a session idle longer than the "
    "minutes given is awake until hold - idle + those minutes after its start, then hibernated "
    "until it ends; a session without an idle measure is taken as never idle"
)


def minutes_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(
            f"{text[:20]!r} is not a number of minutes above 0; give the minutes a notebook stays "
            "idle before it hibernates, e.g. --hibernate-after 20"
        )
    return value


def factor_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 1 <= value <= MAX_FACTOR):
        raise argparse.ArgumentTypeError(
            f"{text[:20]!r} is not a factor from 1 to {MAX_FACTOR:g}; give how many times its memory "
            "a card's slices may hold together, awake or hibernated, e.g. --overcommit 2"
        )
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "hibernation (with --history or --hub-url)",
        "Beside each what-if, the cards needed if idle notebooks had been hibernated "
        "(their GPU memory checkpointed into host memory) and each card overcommitted.",
    )
    g.add_argument(
        "--hibernate-after",
        type=minutes_arg,
        default=None,
        metavar="MINUTES",
        help="hibernate a notebook after this many minutes idle; the history's idle seconds are "
        "taken as the end of each session (a notebook left open after the work), a session "
        "without them as never idle",
    )
    g.add_argument(
        "--overcommit",
        type=factor_arg,
        default=None,
        metavar="FACTOR",
        help=f"with --hibernate-after: a card's slices hold at most FACTOR x its memory (from 1 to "
        f"{MAX_FACTOR:g}; default {DEFAULT_FACTOR:g}), the awake ones at most its memory",
    )


def given(args: argparse.Namespace) -> bool:
    return args.hibernate_after is not None or args.overcommit is not None


def of(args: argparse.Namespace) -> Hibernation | None:
    """The hibernation asked for, or None; ``--overcommit`` alone is refused."""
    if args.hibernate_after is None:
        if args.overcommit is not None:
            raise TraceError(
                "--overcommit goes with --hibernate-after; give both, e.g. "
                "--hibernate-after 20 --overcommit 2"
            )
        return None
    factor = DEFAULT_FACTOR if args.overcommit is None else args.overcommit
    return Hibernation(after=args.hibernate_after * 60, factor=factor)


def row(sessions: Sequence[Session], plan: Plan, hibernation: Hibernation) -> dict[str, Any]:
    """The figures of ``plan``'s replay with ``hibernation`` (:data:`ROW_KEYS`)."""
    full = figures(sessions, replay(sessions, plan, hibernation))
    return {k: full[k] for k in ROW_KEYS}


def add_rows(
    rows: Sequence[dict[str, Any]],
    sessions: Sequence[Session],
    plans: Sequence[Plan],
    hibernation: Hibernation,
    progress: Callable[[int, int, Plan], None] | None = None,
) -> None:
    """Each row gets ``"hibernation"``: its plan replayed with ``hibernation``."""
    for n, (r, plan) in enumerate(zip(rows, plans, strict=True), start=1):
        r["hibernation"] = row(sessions, plan, hibernation)
        if progress is not None:
            progress(n, len(plans), plan)


def document(sessions: Sequence[Session], hibernation: Hibernation) -> dict[str, Any]:
    """What the report says of the model once: the settings and how many sessions hibernate."""
    asleep = sum(1 for s in sessions if hibernation.awake_for(s.hold, s.idle) < s.hold)
    return {
        "after_minutes": round(hibernation.after / 60, 4),
        "overcommit": hibernation.factor,
        "hibernating_spawns": asleep,
        "idle_unmeasured_spawns": sum(1 for s in sessions if s.idle is None),
        "model": MODEL,
    }


def _settings(doc: dict[str, Any]) -> str:
    return f"hibernation after {doc['after_minutes']:g} min idle, overcommit {doc['overcommit']:g}"


def report_lines(r: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    """The single what-if's lines: the figures with hibernation beside those without."""
    h = r["hibernation"]
    return [
        f"  with {_settings(doc)}: peak cards used {h['peak_cards']} (without: {r['peak_cards']})   "
        f"lower bound at peak {h['peak_lower_bound']} (without: {r['peak_lower_bound']})",
        f"  with hibernation: card-hours {h['card_hours']:g} vs bound {h['lower_bound_card_hours']:g}; "
        f"{row_words({**h, 'cards': r['cards']})}",
        *model_lines(doc, r["spawns"]),
    ]


def model_lines(doc: dict[str, Any], spawns: int) -> list[str]:
    return [
        "  hibernation model: idle time taken as the end of each session (a notebook left open after "
        f"the work): {doc['hibernating_spawns']} of {spawns} spawns hibernate (idle over "
        f"{doc['after_minutes']:g} min), {doc['idle_unmeasured_spawns']} with no idle measured are "
        "taken as never idle",
        f"  each card: awake GiB at most its memory, held GiB (awake + hibernated) at most "
        f"{doc['overcommit']:g} x its memory; bound: L2 on both",
    ]


def table_columns(rows: Sequence[dict[str, Any]]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The sweep table's extra columns (none without hibernation): peak and bound with it."""
    if not rows or "hibernation" not in rows[0]:
        return (), [() for _ in rows]
    head: tuple[str, ...] = ("hib waiting", "hib peak", "hib L2")
    body: list[tuple[str, ...]] = [
        (
            f"{r['hibernation']['waited_pct']:.1f}%",
            str(r["hibernation"]["peak_cards"]),
            str(r["hibernation"]["peak_lower_bound"]),
        )
        for r in rows
    ]
    return head, body


def summary(doc: dict[str, Any] | None, spawns: int) -> list[str]:
    """The sweep's lines under its table."""
    if doc is None:
        return []
    return [f"  hib: with {_settings(doc)}", *model_lines(doc, spawns)]


def refuse_without_history(args: argparse.Namespace) -> None:
    if given(args):
        raise TraceError(
            "--hibernate-after and --overcommit replay the hub's history: give --history FILE or --hub-url"
        )
