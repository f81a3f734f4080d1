"""``gpushare-bench``: benchmarks that print figures, never pass/fail on time.

    gpushare-bench replay     packing quality of each policy on the Alibaba trace
    gpushare-bench extender   filter / prioritize / bind latency and throughput of the extender
    gpushare-bench schedule   pods per second through the real kube-scheduler, with and without it
    gpushare-bench plugin     device plugin Allocate latency and ListAndWatch message size
    gpushare-bench spawn      hub spawn to ready through the proxy, on local notebook nodes
    gpushare-bench form       spawn-form render time with availability from a large ledger
    gpushare-bench isolation  on a real GPU: what each framework can allocate in a slice
    gpushare-bench hibernation  on a real GPU: checkpoint and restore per GiB, a woken cell's wait
    gpushare-bench service-memory  what the hub service holds for 1,000 nodes and 10,000 pods
    gpushare-bench startup    start-up time and peak memory of every console script

Each takes ``--json`` for one machine-readable object; its keys are stable.
"""

from __future__ import annotations

import argparse
import sys

from . import extender, form, hibernation, isolation, plugin, replay, schedule, service_memory, spawn, startup


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gpushare-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="what", required=True)
    for mod in (
        replay,
        extender,
        schedule,
        plugin,
        spawn,
        form,
        isolation,
        hibernation,
        service_memory,
        startup,
    ):
        mod.add_parser(sub)
    args = p.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
