"""``gpushare-bench spawn``: from ``POST /hub/api/users/<u>/server`` to the server answering.

A local cluster with the gpushare scheduler and extender, two local notebook nodes (one
Tesla T4 each) run by the node agent, and a real JupyterHub + configurable-http-proxy with a
plain KubeSpawner asking 5 GiB. ``--spawns`` servers are started one after another; for each:

* *total*: from the POST to the first ``200`` of ``GET /user/<u>/api/status`` through the proxy;
* *scheduling + bind*: from the pod's appearance to its binding (a watch stamps both).

Each server is stopped (and its pod gone) before the next starts. Medians are printed.

``--real-node``: the same spawn (GPUShareSpawner, a 5 GiB slice) on a local notebook node (the
pod runs as a local process) and on a real node (kubelet, containerd, runc; Zero to JupyterHub's
hub and proxy as containers, the notebook a container of images/singleuser), ``--spawns`` each;
the medians and their ratio are printed. Root only; a few minutes to bring the real node up.

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


def _spawn_once(hub: Any, cluster: Any, namespace: str, user: str, body: Any, selector: str = "") -> float:
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
    pods = f"/api/v1/namespaces/{namespace}/pods" + (f"?labelSelector={selector}" if selector else "")
    while cluster.get_json(pods)["items"]:
        time.sleep(0.2)
    return took


def compare_plain(spawns: int) -> dict[str, Any]:
    """GPUShareSpawner (5 GiB slice) vs plain KubeSpawner (same pod, no GPU), alternating."""
    from ..localcluster import build
    from ..localcluster.cluster import LocalCluster
    from ..localcluster.hub import LocalHub
    from ..localcluster.notebooknodes import NotebookNodes, spawner_config

    build.build(only=list(build.GROUPS["control-plane"]))  # kwok and notebook nodes: no kubelet
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


NOTEBOOKS = "component%3Dsingleuser-server"  # Zero to JupyterHub's label on user pods


class _Z2JH:
    """Zero to JupyterHub's REST API and proxy, with the methods of LocalHub that _spawn_once uses."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token

    def user_token(self, user: str) -> str:
        self.api("POST", f"/users/{user}")
        return self.token  # the admin token may reach every server (access:servers)

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self._call(method, f"/hub/api{path}", body)

    def proxy_get(self, path: str, token: str, timeout: float = 30) -> tuple[int, Any]:
        return self._call("GET", path, None, timeout)

    def _call(self, method: str, path: str, body: Any, timeout: float = 30) -> tuple[int, Any]:
        import urllib.error
        import urllib.request

        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"token {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()
        except OSError as err:  # the proxy not routing yet
            return 0, str(err)


def _local_notebook_nodes(cluster: Any, count: int) -> None:
    """A started cluster with the gpushare scheduler, ``count`` local notebook nodes (one T4
    each, pods run as local processes) and the namespace ``bench``."""
    from ..localcluster.notebooknodes import NotebookNodes

    cluster.start()
    cluster.start_gpushare_scheduler()
    nodes = NotebookNodes(cluster)
    nodes.add(count, cards=1)
    nodes.start()
    cluster.create_namespace("bench")


def compare_real_node(spawns: int) -> dict[str, Any]:
    """GPUShareSpawner's 5 GiB spawn on a local notebook node, then on a real node."""
    from ..localcluster import build, runtimebuild
    from ..localcluster.cluster import LocalCluster
    from ..localcluster.hub import LocalHub
    from ..localcluster.notebooknodes import spawner_config
    from ..localcluster.realstack import HUB_NAMESPACE, RealStack, default_z2jh_chart

    build.build()
    runtimebuild.build_coredns()
    local: list[float] = []
    with LocalCluster() as cluster:
        _local_notebook_nodes(cluster, 1)
        config = {**spawner_config(), "slices": [SLICE]}
        config.pop("extra_resource_limits")
        hub = LocalHub(cluster, "bench", config, spawner_class="gpushare_hub.GPUShareSpawner").start()
        _spawn_once(hub, cluster, "bench", "warm", {"profile": "t4-5g"})
        for i in range(spawns):
            local.append(_spawn_once(hub, cluster, "bench", f"local{i}", {"profile": "t4-5g"}))
    real: list[float] = []
    with LocalCluster(real_nodes=True) as cluster:
        cluster.start()
        cluster.start_scheduler()
        stack = RealStack.start(cluster, 1)
        stack.install_gpushare()
        stack.install_z2jh(default_z2jh_chart())
        z2jh = _Z2JH(stack.hub_url, stack.admin_token)
        slice_5g = {"profile": "t4-5g"}
        _spawn_once(z2jh, cluster, HUB_NAMESPACE, "warm", slice_5g, NOTEBOOKS)
        for i in range(spawns):
            real.append(_spawn_once(z2jh, cluster, HUB_NAMESPACE, f"real{i}", slice_5g, NOTEBOOKS))
    lm, rm = statistics.median(local), statistics.median(real)
    return {
        "spawns_each": spawns,
        "median_local_process_node_s": round(lm, 2),
        "median_real_node_s": round(rm, 2),
        "real_over_local": round(rm / lm, 2),
        "local_process_node_s": [round(t, 2) for t in local],
        "real_node_s": [round(t, 2) for t in real],
    }


def measure(spawns: int) -> dict[str, Any]:
    from ..localcluster import build
    from ..localcluster.cluster import LocalCluster
    from ..localcluster.hub import LocalHub
    from ..localcluster.notebooknodes import spawner_config

    build.build(only=list(build.GROUPS["control-plane"]))  # kwok and notebook nodes: no kubelet
    with LocalCluster() as cluster:
        _local_notebook_nodes(cluster, 2)
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
        # Three significant figures, not three decimals: on a loaded machine a spawn takes
        # minutes while its bind still takes milliseconds, and a share rounded to 0.0 says nothing.
        "median_scheduling_and_bind_s": float(f"{bind:.3g}"),
        "scheduling_and_bind_share": float(f"{bind / total:.3g}") if total else None,
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
    p.add_argument(
        "--real-node",
        action="store_true",
        help="GPUShareSpawner on a local notebook node against a real node (kubelet, containerd; root)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.real_node:
        out = compare_real_node(args.spawns)
        if args.json:
            print(json.dumps(out))
        else:
            print(
                f"{out['spawns_each']} spawns each, one at a time, GPUShareSpawner 5 GiB, POST /server -> 200"
            )
            print(f"  local notebook node (a local process), median   {out['median_local_process_node_s']} s")
            print(f"  real node (containerd, runc; Z2JH), median      {out['median_real_node_s']} s")
            print(f"  real / local                                    {out['real_over_local']}")
            print(f"  each (local): {out['local_process_node_s']}")
            print(f"  each (real):  {out['real_node_s']}")
        return 0
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
