"""``gpushare-bench spawn``: from ``POST /hub/api/users/<u>/server`` to the server answering.

A local cluster with the gpushare scheduler and extender, two local notebook nodes (one
Tesla T4 each) run by the node agent, and a real JupyterHub + configurable-http-proxy with a
plain KubeSpawner asking 5 GiB. ``--spawns`` servers are started one after another; for each:

* *total*: from the POST to the first ``200`` of ``GET /user/<u>/api/status`` through the proxy;
* *scheduling + bind*: from the pod's appearance to its binding (a watch stamps both).

Each server is stopped (and its pod gone) before the next starts. Medians are printed.

``--compare-plain``: two hubs in the same cluster, one with ``GPUShareSpawner`` (a 5 GiB
catalogue slice, REST ``{"profile": "t4-5g"}``, the gpushare scheduler) and one with a plain
``KubeSpawner`` making the same pod without any GPU (default scheduler); spawns alternate
between them, so both see the same machine, and the overhead ratio of the medians is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from typing import Any

from .args import at_least_one


def _watch(cluster: Any, namespace: str, seen: dict[str, dict[str, float]], stop: threading.Event) -> None:
    from kubernetes import watch

    api = cluster.core_api()
    while not stop.is_set():
        w: Any = watch.Watch()  # type: ignore[no-untyped-call]
        try:
            for ev in w.stream(api.list_namespaced_pod, namespace, timeout_seconds=30):
                name = ev["object"].metadata.name
                now = time.monotonic()
                stamps = seen.setdefault(name, {})
                stamps.setdefault("created", now)
                if ev["object"].spec.node_name:
                    stamps.setdefault("bound", now)
                if stop.is_set():
                    w.stop()
                    break
        except Exception:  # the cluster stopping under the watch, or a dropped connection
            time.sleep(0.2)


SLICE = {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]}


def _spawn_once(hub: Any, cluster: Any, namespace: str, user: str, body: Any) -> float:
    """POST, then poll the server through the proxy; seconds to the first 200. Stops it again."""
    token = hub.user_token(user)
    t0 = time.monotonic()
    status, reply = hub.api("POST", f"/users/{user}/server", body)
    if status not in (201, 202):
        raise RuntimeError(f"spawn of {user} refused: HTTP {status} {reply}")
    while hub.proxy_get(f"/user/{user}/api/status", token, timeout=10)[0] != 200:
        if time.monotonic() - t0 > 300:
            raise RuntimeError(f"{user}'s server did not answer in 300 s; logs in {cluster.logs}")
        time.sleep(0.05)
    took = time.monotonic() - t0
    hub.api("DELETE", f"/users/{user}/server")
    while cluster.get_json(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        time.sleep(0.2)
    return took


def compare_plain(spawns: int) -> dict[str, Any]:
    """GPUShareSpawner (5 GiB slice) vs plain KubeSpawner (same pod, no GPU), alternating."""
    from ..localcluster import build
    from ..localcluster.cluster import LocalCluster
    from ..localcluster.hub import LocalHub
    from ..localcluster.notebooknodes import NotebookNodes, spawner_config

    build.build()
    with LocalCluster() as cluster:
        cluster.start()
        cluster.start_scheduler()  # the plain pods' default scheduler
        cluster.start_gpushare_scheduler()
        nodes = NotebookNodes(cluster)
        nodes.add(2, cards=1)
        nodes.start()
        plain_config = spawner_config()
        plain_config.pop("extra_resource_limits")
        plain_config["scheduler_name"] = "default-scheduler"
        gpu_config = {**spawner_config(), "slices": [SLICE]}
        gpu_config.pop("extra_resource_limits")
        for ns in ("bench-gpu", "bench-plain"):
            cluster.create_namespace(ns)
        gpu_hub = LocalHub(
            cluster, "bench-gpu", gpu_config, spawner_class="gpushare_hub.GPUShareSpawner", name="hub-gpu"
        ).start()
        plain_hub = LocalHub(cluster, "bench-plain", plain_config, name="hub-plain").start()
        # One warm-up spawn each (first imports, the hub's shared ledger watch), not counted.
        _spawn_once(gpu_hub, cluster, "bench-gpu", "warm", {"profile": "t4-5g"})
        _spawn_once(plain_hub, cluster, "bench-plain", "warm", None)
        gpu, plain = [], []
        for i in range(spawns):
            gpu.append(_spawn_once(gpu_hub, cluster, "bench-gpu", f"gpu{i}", {"profile": "t4-5g"}))
            plain.append(_spawn_once(plain_hub, cluster, "bench-plain", f"plain{i}", None))
    g, p = statistics.median(gpu), statistics.median(plain)
    return {
        "spawns_each": spawns,
        "median_gpushare_s": round(g, 3),
        "median_plain_s": round(p, 3),
        "overhead_ratio": round(g / p - 1, 4),
        "gpushare_s": [round(t, 2) for t in gpu],
        "plain_s": [round(t, 2) for t in plain],
    }


def measure(spawns: int) -> dict[str, Any]:
    from ..localcluster import build
    from ..localcluster.cluster import LocalCluster
    from ..localcluster.hub import LocalHub
    from ..localcluster.notebooknodes import NotebookNodes, spawner_config

    build.build()
    with LocalCluster() as cluster:
        cluster.start()
        cluster.start_gpushare_scheduler()
        nodes = NotebookNodes(cluster)
        nodes.add(2, cards=1)
        nodes.start()
        cluster.create_namespace("bench")
        hub = LocalHub(cluster, "bench", spawner_config(slice_gib=5)).start()
        seen: dict[str, dict[str, float]] = {}
        stop = threading.Event()
        threading.Thread(target=_watch, args=(cluster, "bench", seen, stop), daemon=True).start()
        totals, binds = [], []
        for i in range(spawns):
            user = f"bench{i}"
            token = hub.user_token(user)
            t0 = time.monotonic()
            status, body = hub.api("POST", f"/users/{user}/server")
            if status not in (201, 202):
                raise RuntimeError(f"spawn of {user} refused: HTTP {status} {body}")
            while hub.proxy_get(f"/user/{user}/api/status", token, timeout=10)[0] != 200:
                if time.monotonic() - t0 > 300:
                    raise RuntimeError(f"{user}'s server did not answer in 300 s; logs in {cluster.logs}")
                time.sleep(0.05)
            totals.append(time.monotonic() - t0)
            stamps = seen.get(f"jupyter-{user}", {})
            if "bound" in stamps:
                binds.append(stamps["bound"] - stamps["created"])
            hub.api("DELETE", f"/users/{user}/server")
            while cluster.get_json("/api/v1/namespaces/bench/pods")["items"]:
                time.sleep(0.2)
        stop.set()
    total, bind = statistics.median(totals), statistics.median(binds) if binds else float("nan")
    return {
        "spawns": spawns,
        "median_spawn_to_ready_s": round(total, 2),
        "median_scheduling_and_bind_s": round(bind, 3),
        "scheduling_and_bind_share": round(bind / total, 3) if total else None,
        "spawn_to_ready_s": [round(t, 2) for t in totals],
    }


def add_parser(sub: Any) -> None:
    p = sub.add_parser("spawn", help="hub spawn to ready through the proxy, on local notebook nodes")
    p.add_argument("--spawns", type=at_least_one, default=10)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--compare-plain",
        action="store_true",
        help="GPUShareSpawner (5 GiB slice) vs plain KubeSpawner (same pod, no GPU), alternating",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.compare_plain:
        cmp = compare_plain(args.spawns)
        if args.json:
            print(json.dumps(cmp))
        else:
            n = cmp["spawns_each"]
            print(
                f"{n} spawns each, alternating, POST /server -> 200 through the proxy (local notebook nodes)"
            )
            print(f"  GPUShareSpawner, 5 GiB slice, median   {cmp['median_gpushare_s']} s")
            print(f"  plain KubeSpawner, no GPU, median      {cmp['median_plain_s']} s")
            print(f"  overhead                               {cmp['overhead_ratio']:+.1%}")
            print(f"  each (gpushare): {cmp['gpushare_s']}")
            print(f"  each (plain):    {cmp['plain_s']}")
        return 0
    out = measure(args.spawns)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{out['spawns']} spawns, one at a time (plain KubeSpawner, 5 GiB, local notebook nodes)")
        print(f"  POST /server -> 200 through the proxy, median  {out['median_spawn_to_ready_s']} s")
        print(f"  of which scheduling + bind, median          {out['median_scheduling_and_bind_s']} s")
        print(f"  share                                       {out['scheduling_and_bind_share']}")
        print(f"  each: {out['spawn_to_ready_s']}")
    return 0
