"""``gpushare-bench isolation``: what a slice holds on a real GPU (:mod:`.isolation_measure`)."""

from __future__ import annotations

from typing import Any

from gpushare_hub.bench.isolation_measure import add_arguments, run


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "isolation", help="on a real GPU: how much each framework can allocate in a slice (env, hook, MPS)"
    )
    add_arguments(p)
    p.set_defaults(run=run)
