"""The extender proven against the real kube-scheduler: placements, refusals, restarts, churn."""

from __future__ import annotations

import json
import random
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor

from kubernetes.client.exceptions import ApiException

from tests.conftest import gpu_pod, wait_for
from tests.support.extender import (
    SCHED,
    allocation,
    bound,
    check_no_overcommit_from_the_api_server,
    events_for,
    inspect,
    pods_in,
)


def test_three_one_gib_pods_land_on_one_card_of_one_node(local_cluster, gpushare, node_group, namespace):
    _nodes, sel = node_group(3, cards=2)
    api = local_cluster.core_api()
    for i in range(3):
        api.create_namespaced_pod(namespace, gpu_pod(f"nb-{i}", 1, SCHED, sel))
    pods = wait_for(lambda: bound(local_cluster, namespace, 3))
    assert pods, f"not all bound: {events_for(local_cluster, namespace, 'nb-0')}"
    cards = {(p["spec"]["nodeName"], allocation(p)["cards"][0]["uuid"]) for p in pods}
    assert len(cards) == 1
    node, uuid = cards.pop()
    for p in pods:
        ann = p["metadata"]["annotations"]
        assert ann["ALIYUN_COM_GPU_MEM_POD"] == "1" and ann["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
        assert ann["ALIYUN_COM_GPU_MEM_DEV"] == "15" and allocation(p)["node"] == node
    card = next(c for c in inspect(gpushare.url, node)["nodes"][0]["cards"] if c["uuid"] == uuid)
    assert card["used"] == 3 and sorted(h["pod"] for h in card["pods"]) == [
        f"{namespace}/nb-{i}" for i in range(3)
    ]


def test_free_memory_split_over_cards_leaves_the_pod_pending_with_our_reason(
    local_cluster, gpushare, node_group, namespace
):
    _nodes, sel = node_group(1, cards=2)
    api = local_cluster.core_api()
    api.create_namespaced_pod(namespace, gpu_pod("a", 9, SCHED, sel))
    api.create_namespaced_pod(namespace, gpu_pod("b", 9, SCHED, sel))
    assert wait_for(lambda: bound(local_cluster, namespace, 2))
    api.create_namespaced_pod(namespace, gpu_pod("c", 10, SCHED, sel))  # 12 GiB free in all, 6 per card
    msgs = wait_for(lambda: [m for m in events_for(local_cluster, namespace, "c") if "FailedScheduling" in m])
    assert msgs and "no card on node" in msgs[0] and "largest free block is 6 GiB" in msgs[0]
    assert api.read_namespaced_pod("c", namespace).spec.node_name is None


def test_larger_than_any_card_is_refused_with_the_way_out(local_cluster, gpushare, node_group, namespace):
    _nodes, sel = node_group(1, cards=2)
    local_cluster.core_api().create_namespaced_pod(namespace, gpu_pod("huge", 16, SCHED, sel))
    msgs = wait_for(
        lambda: [m for m in events_for(local_cluster, namespace, "huge") if "FailedScheduling" in m]
    )
    assert msgs and "hold at most 15 GiB, the pod asks 16 GiB on one card" in msgs[0]


def test_binpack_fills_a_node_before_the_next_and_spread_does_the_opposite(
    local_cluster, gpushare, node_group, namespace
):
    api = local_cluster.core_api()
    nodes, sel = node_group(2, cards=2)
    for i in range(3):
        api.create_namespaced_pod(namespace, gpu_pod(f"pack-{i}", 8, SCHED, sel))
    pods = wait_for(lambda: bound(local_cluster, namespace, 3))
    assert pods
    per_node = sorted([sum(1 for p in pods if p["spec"]["nodeName"] == n) for n in nodes], reverse=True)
    assert per_node == [2, 1]
    spread = gpushare.spread()
    nodes2, sel2 = node_group(2, cards=2)
    for i in range(2):
        api.create_namespaced_pod(namespace, gpu_pod(f"spread-{i}", 3, spread, sel2))
        assert wait_for(lambda i=i: api.read_namespaced_pod(f"spread-{i}", namespace).spec.node_name)
    placed = {api.read_namespaced_pod(f"spread-{i}", namespace).spec.node_name for i in range(2)}
    assert placed == set(nodes2)


def test_pod_that_skipped_the_dedicated_scheduler_gets_a_warning(
    local_cluster, gpushare, node_group, namespace
):
    _nodes, sel = node_group(1)
    local_cluster.core_api().create_namespaced_pod(namespace, gpu_pod("stray", 2, None, sel))
    msgs = wait_for(
        lambda: [m for m in events_for(local_cluster, namespace, "stray") if "GPUShareNotScheduled" in m]
    )
    assert msgs and "Set spec.schedulerName: gpushare-scheduler" in msgs[0]


def test_extender_killed_during_a_burst_places_every_pod_exactly_once(
    local_cluster, gpushare, node_group, namespace
):
    nodes, sel = node_group(4, cards=2)  # 120 GiB for 100 x 1 GiB
    api = local_cluster.core_api()

    def create(i: int) -> None:
        api.create_namespaced_pod(namespace, gpu_pod(f"burst-{i}", 1, SCHED, sel))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(40)))
        gpushare.restart_extender(kill=True)  # SIGKILL mid-burst, then start again
        list(pool.map(create, range(40, 100)))
    pods = wait_for(lambda: bound(local_cluster, namespace, 100), timeout=120)
    assert pods, f"{len(bound(local_cluster, namespace, 0) or [])} of 100 pods bound"
    for p in pods:
        alloc = allocation(p)
        assert alloc is not None and alloc["node"] == p["spec"]["nodeName"], p["metadata"]["name"]
    check_no_overcommit_from_the_api_server(local_cluster, nodes)
    assert len({p["metadata"]["uid"] for p in pods}) == 100


def test_random_churn_never_overcommits_and_the_ledger_matches_the_annotations(
    local_cluster, gpushare, node_group, namespace
):
    nodes, sel = node_group(20, cards=2)
    api = local_cluster.core_api()
    rng = random.Random(7)
    live: list[str] = []
    for i in range(300):
        if live and rng.random() < 0.35:
            name = live.pop(rng.randrange(len(live)))
            try:
                api.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            except ApiException as err:
                assert err.status == 404
        else:
            name = f"churn-{i}"
            api.create_namespaced_pod(namespace, gpu_pod(name, rng.choice([1, 2, 3, 5, 7, 8]), SCHED, sel))
            live.append(name)

    def settled() -> bool:
        pods = pods_in(local_cluster, namespace)
        names = {p["metadata"]["name"] for p in pods}
        return names == set(live) and all(p["spec"].get("nodeName") for p in pods)

    assert wait_for(settled, timeout=120), "pods did not settle"
    ledger = check_no_overcommit_from_the_api_server(local_cluster, nodes)
    ours = {
        (n["name"], c["uuid"]): (c["used"], sorted(h["pod"] for h in c["pods"]))
        for n in ledger.snapshot()["nodes"]
        for c in n["cards"]
    }

    def theirs() -> dict[tuple[str, str], tuple[int, list[str]]]:
        return {
            (n["name"], c["uuid"]): (c["used"], sorted(h["pod"] for h in c["pods"]))
            for n in inspect(gpushare.url)["nodes"]
            if n["name"] in nodes
            for c in n["cards"]
        }

    # The extender hears of the last deletions through its watch, a moment after the API server.
    assert wait_for(lambda: theirs() == ours, timeout=30), (theirs(), ours)


def test_a_refused_binding_is_an_error_and_holds_no_card(local_cluster, gpushare, node_group, namespace):
    """The API server refuses to bind a pod that is being deleted; the extender must say so."""
    nodes, sel = node_group(1)
    api = local_cluster.core_api()
    body = gpu_pod("going", 3, "nobody-schedules-this", sel)
    body["metadata"]["finalizers"] = ["example.com/hold"]
    api.create_namespaced_pod(namespace, body)
    api.delete_namespaced_pod("going", namespace)  # stays, with a deletionTimestamp, until the finalizer goes
    uid = api.read_namespaced_pod("going", namespace).metadata.uid
    req = json.dumps(
        {"PodName": "going", "PodNamespace": namespace, "PodUID": uid, "Node": nodes[0]}
    ).encode()
    with urllib.request.urlopen(
        urllib.request.Request(
            f"{gpushare.url}/gpushare-scheduler/bind", data=req, headers={"Content-Type": "application/json"}
        )
    ) as r:
        out = json.loads(r.read())
    assert out["Error"].startswith(f"binding pod {namespace}/going to {nodes[0]} failed")
    assert all(c["used"] == 0 for c in inspect(gpushare.url, nodes[0])["nodes"][0]["cards"])
    api.patch_namespaced_pod("going", namespace, {"metadata": {"finalizers": None}})
    missing = json.dumps({"PodName": "ghost", "PodNamespace": namespace, "PodUID": "u-1", "Node": nodes[0]})
    with urllib.request.urlopen(
        urllib.request.Request(f"{gpushare.url}/gpushare-scheduler/bind", data=missing.encode())
    ) as r:
        assert "cannot read it before binding (404" in json.loads(r.read())["Error"]


def test_two_replicas_under_leader_election_place_each_pod_once(
    local_cluster, gpushare, node_group, namespace
):
    """Two scheduler + sidecar-extender pairs: only the leader decides, and the other takes over."""
    from gpushare_hub.extender.schedconfig import extender_entry, profile

    nodes, sel = node_group(2, cards=2)
    name = "gpushare-ha"
    election = {
        "leaderElection": {
            "leaderElect": True,
            "resourceName": name,
            "resourceNamespace": "kube-system",
            # Kubernetes' defaults: a shorter renewal deadline loses the lease whenever etcd
            # stalls a few seconds on a loaded machine, and the placements split.
            "leaseDuration": "15s",
            "renewDeadline": "10s",
            "retryPeriod": "2s",
        }
    }
    pairs = []
    for replica in ("a", "b"):
        ext = local_cluster.start_extender("binpack", name=f"gpushare-extender-{name}-{replica}")
        sched = local_cluster.start_scheduler(
            name,
            extenders=[extender_entry(f"{ext.url}/gpushare-scheduler")],
            profile=profile(name),
            extra=election,
            replica=replica,
        )
        pairs.append((ext, sched))
    api = local_cluster.core_api()
    for i in range(10):
        api.create_namespaced_pod(namespace, gpu_pod(f"ha-{i}", 2, name, sel))
    assert wait_for(lambda: bound(local_cluster, namespace, 10), timeout=60)

    def placements(ext) -> float:
        with urllib.request.urlopen(ext.metrics_url + "/metrics", timeout=5) as r:
            lines = [
                ln
                for ln in r.read().decode().splitlines()
                if ln.startswith("gpushare_extender_placements_total")
            ]
        return sum(float(ln.split()[-1]) for ln in lines)

    counts = [placements(ext) for ext, _ in pairs]
    assert sorted(counts) == [0.0, 10.0], counts  # one leader did all the work
    leader = counts.index(10.0)
    pairs[leader][1].kill()  # the leader's pod dies: its scheduler and its sidecar
    pairs[leader][0].kill()
    for i in range(10, 16):
        api.create_namespaced_pod(namespace, gpu_pod(f"ha-{i}", 2, name, sel))
    assert wait_for(lambda: bound(local_cluster, namespace, 16), timeout=120), (
        "the other replica did not take over"
    )
    assert placements(pairs[1 - leader][0]) == 6.0
    pods = bound(local_cluster, namespace, 16)
    assert all(allocation(p) and allocation(p)["node"] == p["spec"]["nodeName"] for p in pods)
    check_no_overcommit_from_the_api_server(local_cluster, nodes)


def test_waiting_pods_are_served_in_the_order_they_were_made(local_cluster, gpushare, node_group, namespace):
    """An older 5 GiB pod has waited long (tried again on each release nearby, so kube-scheduler's
    backoff for it is at its longest); three younger ones wait too, freshly tried. The card then
    frees room for three: kube-scheduler retries the younger ones first (their backoff is
    shorter), but the room goes to the oldest and the next two, and the youngest waits for the
    next room (pods made in the same second are in the order of their names, as the spawn page
    counts them)."""
    _nodes, sel = node_group(1, cards=1)
    api = local_cluster.core_api()

    def placed() -> set[str]:
        return {p["metadata"]["name"] for p in pods_in(local_cluster, namespace) if p["spec"].get("nodeName")}

    def churn(rounds: int) -> None:
        """A 1 GiB pod comes and goes: each release makes kube-scheduler try the waiting pods again."""
        for _ in range(rounds):
            name = f"filler-{uuid_suffix()}"
            api.create_namespaced_pod(namespace, gpu_pod(name, 1, SCHED, sel))
            assert wait_for(lambda n=name: n in placed())
            api.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            assert wait_for(
                lambda n=name: n not in {p["metadata"]["name"] for p in pods_in(local_cluster, namespace)}
            )
            time.sleep(1.5)  # its retry (no assertion rests on the timing)

    api.create_namespaced_pod(namespace, gpu_pod("holder", 11, SCHED, sel))
    assert wait_for(lambda: placed() == {"holder"})
    api.create_namespaced_pod(namespace, gpu_pod("w0", 5, SCHED, sel))  # 4 GiB free with a filler
    churn(5)
    for name in ("w1", "w2", "w3"):
        api.create_namespaced_pod(namespace, gpu_pod(name, 5, SCHED, sel))
    for name in ("w0", "w1", "w2", "w3"):  # each was tried and refused: all four are in line
        assert wait_for(
            lambda n=name: any("FailedScheduling" in m for m in events_for(local_cluster, namespace, n))
        )
    churn(1)
    api.delete_namespaced_pod("holder", namespace, grace_period_seconds=0)
    assert wait_for(lambda: len(placed()) == 3, timeout=120), placed()
    assert placed() == {"w0", "w1", "w2"}, events_for(local_cluster, namespace, "w3")
    api.delete_namespaced_pod("w1", namespace, grace_period_seconds=0)
    assert wait_for(lambda: placed() == {"w0", "w2", "w3"}, timeout=120), placed()


def uuid_suffix() -> str:
    return uuid.uuid4().hex[:6]
