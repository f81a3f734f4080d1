"""``gpushare-bench extender``: latency and throughput of the extender's HTTP verbs.

The extender runs in its own process with an in-memory ledger of
``--nodes`` nodes x 4 Tesla T4, a third of the cards partly used. The client
sends what kube-scheduler sends with ``nodeCacheCapable: true``: the pod and
every node name. Bind goes through the whole bind path (pod read, card choice,
ledger commit, Binding call) against an in-process stand-in for the API server
that answers at once, so ``bind_*`` measure the extender's own work only; the
real API server's share is in ``gpushare-bench schedule``.

``--policy`` picks the extender's default policy. A policy that learns the workload from the
pods it places (fgd, strand) is shown each of the bench's slice sizes once before the
measurement, so that its node scores are computed as they would be in a running cluster.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Any

from ..core import POLICIES, Demand, Ledger, Node, PodObject, declared_cards, read_pod
from ..localcluster.processes import free_port
from .args import at_least_one

PREFIX = "/gpushare-scheduler"
SIZES = (1, 2, 3, 5, 7, 8, 10, 13)  # slice sizes the bench's pods ask, as a hub's profiles would


def pod(name: str, units: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}", "annotations": {}},
        "spec": {
            "containers": [{"name": "notebook", "resources": {"limits": {"aliyun.com/gpu-mem": str(units)}}}]
        },
        "status": {"phase": "Pending"},
    }


def build_ledger(nodes: int) -> Ledger:
    from ..core import CardShare, Placement

    ledger = Ledger()
    for i in range(nodes):
        name = f"node-{i:05d}"
        ledger.set_node(Node(name, declared_cards(name, 4, "Tesla T4", 15360)))
    for i in range(0, nodes * 4, 3):  # every third card holds a 5 GiB slice
        node = f"node-{i // 4:05d}"
        card = ledger.node(node).cards[i % 4]  # type: ignore[union-attr]
        ledger.commit(Placement(f"bench/held-{i}", node, (CardShare(card.uuid, card.index, 5),)))
    return ledger


class InstantKube:
    """Answers the extender's API calls from memory, at once (see the module docstring)."""

    async def get_pod(self, namespace: str, name: str) -> PodObject:
        return read_pod(pod(name, 1))  # read as the real Kube reads the API server's answer

    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        return None

    async def get_claim_template(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None  # the bench's pods ask gpu-mem: no DRA claim template is ever read

    async def close(self) -> None:
        return None


def bench_service(nodes: int, policy: str) -> Any:
    """The extender's service on the bench's ledger, its API answered at once."""
    from gpushare_hub.extender.service import ExtenderService

    from ..kube import LedgerInformer

    informer = LedgerInformer(None)
    informer.ledger = build_ledger(nodes)
    informer.synced = True
    service = ExtenderService(
        kube=InstantKube(),  # type: ignore[arg-type]
        policy=policy,
        warn_bypass=False,
        informer=informer,
    )
    learner = service.decisions.placer().policy
    for s in SIZES:  # a no-op for policies that learn nothing
        learner.observe(Demand(f"bench/seen-{s}", s, 1), True)
    return service


def filter_work(nodes: int, requests: int, policy: str) -> list[float]:
    """Milliseconds of the extender's own work per filter (read the body, decide, write the
    answer), in this process without HTTP: the figure a busy machine's scheduling noise and
    the client's share of the cores do not blur."""
    from gpushare_hub.extender.wire import ExtenderArgs, filter_result

    service = bench_service(nodes, policy)
    names = [f"node-{i:05d}" for i in range(nodes)]
    bodies = [
        json.dumps({"Pod": pod(f"asker-{s}", s), "Nodes": None, "NodeNames": names}).encode() for s in SIZES
    ]

    def one(body: bytes) -> None:
        args = ExtenderArgs.parse(body)
        out = service.decisions.filter(args)
        if out.demand is not None:
            service.remember(args.pod)
        json.dumps(filter_result(args, out.passed, out.failed, out.unresolvable, out.error))

    for b in bodies:  # the cold requests, as in the HTTP measurement
        one(b)
    lat = []
    for i in range(requests):
        t0 = time.perf_counter()
        one(bodies[i % len(bodies)])
        lat.append((time.perf_counter() - t0) * 1000)
    return lat


def serve(nodes: int, port: int, policy: str = "binpack") -> None:
    from tornado.httpserver import HTTPServer

    from gpushare_hub.extender.handlers import make_app

    async def run() -> None:
        service = bench_service(nodes, policy)
        HTTPServer(make_app(service, PREFIX)).listen(port, "127.0.0.1")
        await asyncio.Event().wait()

    import logging

    logging.getLogger("tornado.access").setLevel(logging.WARNING)
    asyncio.run(run())


def _timed(conn: http.client.HTTPConnection, path: str, body: bytes) -> float:
    t0 = time.perf_counter()
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    dt = time.perf_counter() - t0
    if resp.status != 200 or (b'"Error": "' in data and b'"Error": ""' not in data):
        raise RuntimeError(f"{path} answered {resp.status}: {data[:200]!r}")
    return dt * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def measure(nodes: int, requests: int, threads: int, policy: str = "binpack") -> dict[str, Any]:
    port = free_port()
    code = f"from gpushare_hub.bench.extender import serve; serve({nodes}, {port}, {policy!r})"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/inspect/node-00000", timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("bench server did not start") from None
                time.sleep(0.2)
        names = [f"node-{i:05d}" for i in range(nodes)]
        # Pods of every common slice size, in turn, as a hub's profiles would send them.
        bodies = [
            json.dumps({"Pod": pod(f"asker-{s}", s), "Nodes": None, "NodeNames": names}).encode()
            for s in SIZES
        ]
        args = bodies[0]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        # The first request of a size evaluates every node (cold); later ones reuse what
        # did not change. Report the cold figure, then measure the steady state.
        cold = [_timed(conn, f"{PREFIX}/filter", b) for b in bodies]
        for b in bodies * 2:
            _timed(conn, f"{PREFIX}/prioritize", b)
        out: dict[str, Any] = {
            "nodes": nodes,
            "cards": nodes * 4,
            "policy": policy,
            "requests_per_verb": requests,
            "filter_cold_p50_ms": round(statistics.median(cold), 3),
        }
        for verb in ("filter", "prioritize"):
            lat = [_timed(conn, f"{PREFIX}/{verb}", bodies[i % len(bodies)]) for i in range(requests)]
            out[f"{verb}_p50_ms"] = pct(lat, 0.50)
            out[f"{verb}_p99_ms"] = pct(lat, 0.99)
        lat = []
        for i in range(requests):
            b = json.dumps(
                {
                    "PodName": f"b-{i}",
                    "PodNamespace": "bench",
                    "PodUID": f"uid-b-{i}",
                    "Node": names[i % nodes],
                }
            ).encode()
            lat.append(_timed(conn, f"{PREFIX}/bind", b))
        out["bind_p50_ms"] = pct(lat, 0.50)
        out["bind_p99_ms"] = pct(lat, 0.99)
        out["bind_excludes_api_server"] = True
        conn.close()
        # Throughput: several keep-alive clients sending filter requests at once.
        count = [0] * threads
        stop_at = time.perf_counter() + 3.0

        def client(k: int) -> None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            while time.perf_counter() < stop_at:
                _timed(c, f"{PREFIX}/filter", args)
                count[k] += 1
            c.close()

        started = time.perf_counter()
        workers = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        out["requests_per_s"] = round(sum(count) / (time.perf_counter() - started), 1)
        out["client_threads"] = threads
    finally:
        proc.terminate()
        proc.wait(10)
    work = filter_work(nodes, max(requests, 1000), policy)
    out["filter_work_p50_ms"] = pct(work, 0.50)
    out["filter_work_p99_ms"] = pct(work, 0.99)
    return out


def add_parser(sub: Any) -> None:
    p = sub.add_parser("extender", help="filter/prioritize/bind latency and requests per second")
    p.add_argument("--nodes", type=at_least_one, default=1000, help="nodes in the ledger (4 cards each)")
    p.add_argument(
        "--requests", type=at_least_one, default=300, help="requests per verb for the latency figures"
    )
    p.add_argument("--threads", type=at_least_one, default=4, help="client threads for the throughput figure")
    p.add_argument(
        "--policy", choices=sorted(POLICIES), default="binpack", help="the extender's default policy"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = measure(args.nodes, args.requests, args.threads, args.policy)
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"extender, {out['nodes']} nodes x 4 cards, policy {out['policy']} "
            "(bind without the API server's round trip):"
        )
        print(f"  filter, cold p50 {out['filter_cold_p50_ms']:8.3f} ms (first request of each slice size)")
        for verb in ("filter", "prioritize", "bind"):
            print(f"  {verb:10s} p50 {out[f'{verb}_p50_ms']:8.3f} ms   p99 {out[f'{verb}_p99_ms']:8.3f} ms")
        print(f"  throughput {out['requests_per_s']} filter requests/s with {out['client_threads']} clients")
        print(
            f"  filter's own work (no HTTP): p50 {out['filter_work_p50_ms']:.3f} ms   "
            f"p99 {out['filter_work_p99_ms']:.3f} ms"
        )
    return 0
