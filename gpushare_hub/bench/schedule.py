"""``gpushare-bench schedule``: pods per second through the real kube-scheduler, with and without us.

One local cluster with ``--nodes`` kwok nodes (4 Tesla T4 each). Two runs of
``--pods`` pods asking 1 GiB of ``aliyun.com/gpu-mem``:

* *with*: the dedicated gpushare scheduler calling the extender (filter, prioritize, bind);
* *without*: the same scheduler profile and client limits, no extender; the
  in-tree fit check alone counts the extended resource.

In each run the pods exist before their scheduler starts, and a watch stamps
each pod when its binding is seen; the rate is taken from the first binding
to the last, so process start-up is not counted.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..localcluster import build
from .args import at_least_one

CLIENT = {"clientConnection": {"qps": 5000, "burst": 5000}}


def _pods(cluster: Any, namespace: str, count: int, scheduler: str) -> None:
    api = cluster.core_api()

    def create(i: int) -> None:
        api.create_namespaced_pod(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"p-{i}"},
                "spec": {
                    "schedulerName": scheduler,
                    "containers": [
                        {
                            "name": "notebook",
                            "image": "jupyter",
                            "resources": {"limits": {"aliyun.com/gpu-mem": "1"}},
                        }
                    ],
                },
            },
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(count)))


def _watch_bindings(cluster: Any, namespace: str, count: int, timeout: float) -> list[float]:
    """Times at which each pod was first seen bound (a watch, reopened if the server ends it)."""
    from kubernetes import watch

    api = cluster.core_api()
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    rv = ""
    while len(seen) < count and time.monotonic() < deadline:
        w = watch.Watch()  # type: ignore[no-untyped-call]
        kwargs: dict[str, Any] = {"timeout_seconds": max(1, int(deadline - time.monotonic()))}
        if rv:
            kwargs["resource_version"] = rv
        try:
            for event in w.stream(api.list_namespaced_pod, namespace, **kwargs):  # type: ignore[no-untyped-call]
                pod = event["object"]
                rv = pod.metadata.resource_version or rv
                if pod.spec.node_name and pod.metadata.name not in seen:
                    seen[pod.metadata.name] = time.perf_counter()
                if len(seen) >= count:
                    w.stop()  # type: ignore[no-untyped-call]
        except Exception:  # the watch broke (e.g. too old a version): list and watch again
            rv = ""
    return sorted(seen.values())


def _run(cluster: Any, namespace: str, pods: int, start: Any, timeout: float) -> dict[str, Any]:
    cluster.create_namespace(namespace)
    scheduler = f"sched-{namespace}"
    _pods(cluster, namespace, pods, scheduler)
    times: list[float] = []
    watcher = threading.Thread(
        target=lambda: times.extend(_watch_bindings(cluster, namespace, pods, timeout))
    )
    watcher.start()
    time.sleep(0.5)  # the watch is open before anything can bind
    start(scheduler)
    watcher.join()
    if len(times) < pods:
        bound = sum(
            1
            for p in cluster.get_json(f"/api/v1/namespaces/{namespace}/pods")["items"]
            if p["spec"].get("nodeName")
        )
        raise RuntimeError(
            f"only {len(times)} of {pods} pods seen bound within {timeout}s in {namespace} "
            f"({bound} bound according to the API server now)"
        )
    span = times[-1] - times[0]
    return {
        "pods": pods,
        "seconds": round(span, 3),
        "pods_per_s": round((pods - 1) / span, 1) if span else None,
    }


def measure(nodes: int, pods: int, timeout: float) -> dict[str, Any]:
    from gpushare_hub.extender.schedconfig import extender_entry, profile

    from ..localcluster.cluster import LocalCluster

    build.build(only=list(build.GROUPS["control-plane"]))  # kwok nodes: no kubelet
    with LocalCluster() as cluster:
        cluster.start()
        t0 = time.perf_counter()
        cluster.add_gpu_nodes(nodes, cards=4, prefix="bench-")
        setup = time.perf_counter() - t0
        ext = cluster.start_extender("binpack", extra_args=["--no-warn-bypass"], log_level="WARN")

        def with_extender(name: str) -> None:
            cluster.start_scheduler(
                name,
                extenders=[extender_entry(f"{ext.url}/gpushare-scheduler")],
                profile=profile(name),
                extra=CLIENT,
            )

        def without(name: str) -> None:
            cluster.start_scheduler(name, profile=profile(name), extra=CLIENT)

        a = _run(cluster, "with-extender", pods, with_extender, timeout)
        b = _run(cluster, "without-extender", pods, without, timeout)
    return {
        "nodes": nodes,
        "cards": nodes * 4,
        "pods": pods,
        "node_setup_s": round(setup, 1),
        "pods_per_s_with_extender": a["pods_per_s"],
        "pods_per_s_without": b["pods_per_s"],
        "ratio": round(a["pods_per_s"] / b["pods_per_s"], 3) if a["pods_per_s"] and b["pods_per_s"] else None,
        "seconds_with_extender": a["seconds"],
        "seconds_without": b["seconds"],
    }


def add_parser(sub: Any) -> None:
    p = sub.add_parser("schedule", help="pods/s through kube-scheduler with vs without the extender")
    p.add_argument("--nodes", type=at_least_one, default=500, help="kwok nodes with 4 T4 cards each")
    p.add_argument("--pods", type=at_least_one, default=500, help="pods per run")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for each run's bindings")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = measure(args.nodes, args.pods, args.timeout)
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"kube-scheduler v{build.Versions.load().kubernetes.lstrip('v')}, {out['nodes']} kwok nodes, "
            f"{out['pods']} pods per run"
        )
        print(f"  with the extender     {out['pods_per_s_with_extender']} pods/s")
        print(f"  without (in-tree fit) {out['pods_per_s_without']} pods/s")
        print(f"  ratio                 {out['ratio']}")
    return 0
