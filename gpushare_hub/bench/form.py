"""``gpushare-bench form``: how long the spawn form takes to render with availability.

A ledger of ``--nodes`` nodes with two Tesla T4 each, half full of slices placed by the
binpack placer, and the T4 catalogue of ``examples/jupyterhub_config.py`` (3, 5 and 7 GiB
and a whole card). Each render is ``GPUShareSpawner.get_options_form()`` (KubeSpawner's
template included); between renders one slice is placed or released, so every render
sees a changed node, as on a busy hub. The first render (cold caches) is reported apart.
The spawner is built with KubeSpawner's mock user and hub and contacts no cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any
from unittest import mock

from .args import at_least_one

CATALOGUE = [
    {"slug": "t4-3g", "display_name": "Tesla T4 · 3 GiB", "gib": 3, "models": ["Tesla-T4"]},
    {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]},
    {"slug": "t4-7g", "display_name": "Tesla T4 · 7 GiB", "gib": 7, "models": ["Tesla-T4"]},
    {"slug": "t4-whole", "display_name": "Tesla T4 · whole card", "models": ["Tesla-T4"]},
]


def _ledger(nodes: int, seed: int) -> Any:
    from gpushare_hub.core import Demand, Ledger, Node, Placer
    from gpushare_hub.core.cards import declared_cards

    ledger = Ledger()
    for i in range(nodes):
        name = f"gpu-{i:04d}"
        ledger.set_node(Node(name=name, cards=declared_cards(name, 2, "Tesla T4", 15360)))
    placer = Placer(ledger)
    rng = random.Random(seed)
    target = ledger.totals()[1] // 2
    i = 0
    while ledger.totals()[0] < target:
        placer.place_and_commit(Demand(f"jhub/held-{i}", rng.choice((3, 5, 7)), 1))
        i += 1
    return ledger


async def _measure(nodes: int, renders: int, seed: int) -> dict[str, Any]:
    from traitlets.config import Config

    from gpushare_hub.core import Demand, Placement, Placer
    from gpushare_hub.spawner import GPUShareSpawner

    ledger = _ledger(nodes, seed)
    c = Config()
    c.GPUShareSpawner.slices = CATALOGUE
    c.GPUShareSpawner.ledger_provider = lambda: ledger
    c.GPUShareSpawner.watch_ledger = False
    with mock.patch("kubespawner.spawner.load_config"):
        spawner = GPUShareSpawner(_mock=True, config=c)
    spawner.user.groups = []
    t0 = time.perf_counter()
    form = await spawner.get_options_form()
    cold = (time.perf_counter() - t0) * 1000
    churn = Placer(ledger)
    rng = random.Random(seed + 1)
    times = []
    held: list[str] = []
    for i in range(renders):
        if held and (i % 2 or not rng.random() < 0.5):
            ledger.release(held.pop())
        else:
            decision = churn.place_and_commit(Demand(f"jhub/churn-{i}", rng.choice((3, 5)), 1))
            if isinstance(decision, Placement):
                held.append(decision.key)
        t0 = time.perf_counter()
        form = await spawner.get_options_form()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return {
        "nodes": nodes,
        "slices": len(CATALOGUE),
        "renders": renders,
        "cold_render_ms": round(cold, 3),
        "form_render_p50_ms": round(statistics.median(times), 3),
        "form_render_p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 3),
        "form_bytes": len(form),
    }


def measure(nodes: int, renders: int, seed: int = 0) -> dict[str, Any]:
    return asyncio.run(_measure(nodes, renders, seed))


def add_parser(sub: Any) -> None:
    p = sub.add_parser("form", help="spawn-form render time with availability from a large ledger")
    p.add_argument("--nodes", type=at_least_one, default=200)
    p.add_argument("--renders", type=at_least_one, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = measure(args.nodes, args.renders, args.seed)
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"spawn form with {out['slices']} slices, {out['nodes']} nodes in the ledger: "
            f"p50 {out['form_render_p50_ms']} ms, p99 {out['form_render_p99_ms']} ms over "
            f"{out['renders']} renders (first, cold: {out['cold_render_ms']} ms)"
        )
    return 0
