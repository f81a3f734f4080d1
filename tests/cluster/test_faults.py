"""The extender under API server faults: killed, frozen (SIGSTOP/SIGCONT), down for 30 s, and
binds replayed while the first is in flight. Checked from the API server: no card over-committed.

Each test runs ``GPUSHARE_FAULT_ROUNDS`` rounds (default 1; the figures of
docs/measurements/2026-11-22-faults.md come from more).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gpushare_hub.core import Ledger
from gpushare_hub.localcluster.cluster import LocalCluster
from tests.conftest import gpu_pod, wait_for
from tests.objects import read_nodes, read_pods
from tests.support.extender import allocation, bound, check_no_overcommit_from_the_api_server, inspect

SCHED = "gpushare-faults"
ROUNDS = int(os.environ.get("GPUSHARE_FAULT_ROUNDS", "1"))
STALE_AFTER = 3


class Pair:
    """A dedicated extender (``--stale-after 3``) and the scheduler that calls it."""

    def __init__(self, cluster: LocalCluster) -> None:
        from gpushare_hub.extender.schedconfig import extender_entry, profile

        self.ext = cluster.start_extender(
            "binpack", name="gpushare-extender-faults", extra_args=[f"--stale-after={STALE_AFTER}"]
        )
        self.sched = cluster.start_scheduler(
            SCHED, extenders=[extender_entry(f"{self.ext.url}/gpushare-scheduler")], profile=profile(SCHED)
        )
        self.url = str(self.ext.url)  # the verbs and /inspect
        self.health = str(self.ext.metrics_url)  # /readyz


@pytest.fixture(scope="module")
def pair(local_cluster: LocalCluster) -> Iterator[Pair]:
    p = Pair(local_cluster)
    yield p
    p.sched.stop()
    p.ext.stop()


def burst(cluster: LocalCluster, namespace: str, sel: dict[str, str], count: int, seed: int) -> list[int]:
    """Create ``count`` pods of 1-3 GiB from 8 threads; returns their sizes."""
    rng = random.Random(seed)
    sizes = [rng.choice([1, 1, 1, 2, 3]) for _ in range(count)]
    api = cluster.core_api()

    def create(i: int) -> None:
        api.create_namespaced_pod(namespace, gpu_pod(f"p{seed}-{i}", sizes[i], SCHED, sel))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(count)))
    return sizes


def count_bound(cluster: LocalCluster, namespace: str) -> int:
    try:
        return len(bound(cluster, namespace, 0) or [])
    except OSError:
        return 0


def check_every_pod_bound_once(cluster: LocalCluster, namespace: str, nodes: list[str], count: int) -> None:
    pods = wait_for(lambda: _bound_or_none(cluster, namespace, count), timeout=300, every=1.0)
    assert pods, f"{count_bound(cluster, namespace)} of {count} pods bound"
    for p in pods:
        alloc = allocation(p)
        assert alloc is not None and alloc["node"] == p["spec"]["nodeName"], p["metadata"]["name"]
    assert len({p["metadata"]["uid"] for p in pods}) == count
    check_no_overcommit_from_the_api_server(cluster, nodes)


def _bound_or_none(cluster: LocalCluster, namespace: str, count: int) -> list[dict[str, Any]] | None:
    try:
        return bound(cluster, namespace, count)
    except OSError:
        return None


def ledger_matches_the_api_server(cluster: LocalCluster, url: str, nodes: list[str]) -> bool:
    all_nodes = cluster.get_json("/api/v1/nodes")["items"]
    all_pods = cluster.get_json("/api/v1/pods")["items"]
    truth = Ledger.from_objects(
        read_nodes([n for n in all_nodes if n["metadata"]["name"] in nodes]), read_pods(all_pods)
    )

    def shape(snap: dict[str, Any]) -> dict[tuple[str, str], tuple[int, list[str]]]:
        return {
            (n["name"], c["uuid"]): (c["used"], sorted(h["pod"] for h in c["pods"]))
            for n in snap["nodes"]
            if n["name"] in nodes
            for c in n["cards"]
        }

    return shape(inspect(url)) == shape(truth.snapshot())


def readyz(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


def test_api_server_killed_mid_burst_overcommits_no_card(local_cluster, pair, node_group, namespace):
    for r in range(ROUNDS):
        nodes, sel = node_group(7, cards=2)  # 210 GiB for about 170 GiB of pods
        sizes = burst(local_cluster, namespace, sel, 100, seed=r)
        assert wait_for(lambda r=r: count_bound(local_cluster, namespace) >= 100 * r + 15, 120, 0.05)
        local_cluster.kill_apiserver()
        time.sleep(2)
        local_cluster.start_apiserver_again()
        check_every_pod_bound_once(local_cluster, namespace, nodes, 100 * (r + 1))
        print(f"round {r}: 100 pods, {sum(sizes)} GiB, API server killed once, 0 cards over-committed")


def test_api_server_frozen_mid_burst_overcommits_no_card(local_cluster, pair, node_group, namespace):
    for r in range(ROUNDS):
        nodes, sel = node_group(7, cards=2)
        burst(local_cluster, namespace, sel, 100, seed=100 + r)
        assert wait_for(lambda r=r: count_bound(local_cluster, namespace) >= 100 * r + 15, 120, 0.05)
        local_cluster.freeze("kube-apiserver")
        try:
            time.sleep(7)
        finally:
            local_cluster.thaw("kube-apiserver")
        check_every_pod_bound_once(local_cluster, namespace, nodes, 100 * (r + 1))
        print(f"round {r}: 100 pods, API server frozen 7 s once, 0 cards over-committed")


def test_api_server_down_30s_every_pod_bound_once_and_readyz_recovers(
    local_cluster, pair, node_group, namespace
):
    nodes, sel = node_group(7, cards=2)
    seen: list[int] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            seen.append(readyz(pair.health))
            time.sleep(0.5)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        burst(local_cluster, namespace, sel, 100, seed=200)
        assert wait_for(lambda: count_bound(local_cluster, namespace) >= 15, 120, 0.05)
        local_cluster.kill_apiserver()
        time.sleep(30)
        local_cluster.start_apiserver_again()
        check_every_pod_bound_once(local_cluster, namespace, nodes, 100)
    finally:
        done.set()
        poller.join(5)
    assert seen[0] == 200
    assert 503 in seen, f"/readyz never answered 503 while the API server was down: {sorted(set(seen))}"
    assert wait_for(lambda: readyz(pair.health) == 200, timeout=60)  # and back
    assert wait_for(lambda: ledger_matches_the_api_server(local_cluster, pair.url, nodes), timeout=30)


def post(url: str, body: dict[str, Any], timeout: float = 30) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        result: dict[str, Any] = json.loads(r.read())
        return result


class Scheduler:
    """Sends filter and bind to the extender as kube-scheduler does (capitalised keys)."""

    def __init__(self, pair: Pair, namespace: str, nodes: list[str]) -> None:
        self.prefix = f"{pair.url}/gpushare-scheduler"
        self.namespace = namespace
        self.nodes = nodes
        self.pods: dict[str, dict[str, Any]] = {}

    def schedule(self, name: str, node: str) -> str:
        """Filter, then bind to ``node`` if it passed; returns the bind's Error ("" when bound)."""
        pod = self.pods[name]
        out = post(f"{self.prefix}/filter", {"Pod": pod, "NodeNames": self.nodes})
        if node not in (out.get("NodeNames") or []):
            return "filtered out"
        uid = pod["metadata"]["uid"]
        args = {"PodName": name, "PodNamespace": self.namespace, "PodUID": uid, "Node": node}
        return str(post(f"{self.prefix}/bind", args).get("Error", ""))


def test_binds_replayed_while_the_first_is_in_flight_overcommit_no_card(
    local_cluster, pair, node_group, namespace
):
    """As kube-scheduler does after a bind that timed out: filter and bind the pod again,
    here to either node, while the first Binding waits inside a frozen API server."""
    api = local_cluster.core_api()
    for r in range(ROUNDS):
        nodes, sel = node_group(2, cards=2)  # 60 GiB; 24 pods of 4 GiB cannot all fit
        names = [f"r{r}-{i}" for i in range(24)]
        for name in names:
            api.create_namespaced_pod(namespace, gpu_pod(name, 4, "nobody-schedules-this", sel))
        sched = Scheduler(pair, namespace, nodes)
        for p in local_cluster.get_json(f"/api/v1/namespaces/{namespace}/pods")["items"]:
            sched.pods[p["metadata"]["name"]] = p
        with ThreadPoolExecutor(8) as pool:
            first = [pool.submit(sched.schedule, n, nodes[0]) for n in names[:8]]
            time.sleep(1)
            local_cluster.freeze("kube-apiserver")
            try:
                more = [pool.submit(sched.schedule, n, nodes[i % 2]) for i, n in enumerate(names[8:16])]
                time.sleep(1)
                replays = [pool.submit(sched.schedule, n, nodes[1]) for n in names[4:16]]
                time.sleep(6)
            finally:
                local_cluster.thaw("kube-apiserver")
            for f in first + more + replays:
                f.result()
        # The rest of the burst, and more passes for pods whose bind failed, as the scheduler would.
        for _ in range(3):
            for name in names:
                pod = local_cluster.get_json(f"/api/v1/namespaces/{namespace}/pods/{name}")
                if not pod["spec"].get("nodeName"):
                    sched.pods[name] = pod
                    for node in nodes:
                        if not sched.schedule(name, node):
                            break
            time.sleep(6)  # let unknown outcomes settle
        check_no_overcommit_from_the_api_server(local_cluster, nodes)
        pods = local_cluster.get_json(f"/api/v1/namespaces/{namespace}/pods")["items"]
        placed = [p for p in pods if p["spec"].get("nodeName") in nodes]
        assert wait_for(
            lambda nodes=nodes: ledger_matches_the_api_server(local_cluster, pair.url, nodes), timeout=30
        )
        print(f"round {r}: 24 pods, {len(placed)} placed, 12 replayed binds, API server frozen 8 s, 0 over")
