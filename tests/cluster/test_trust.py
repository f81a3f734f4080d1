"""Backend trust against the real API server and kube-scheduler: forged records, callers, replicas."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
import uuid as uuidlib
from typing import Any

from gpushare_hub.core import AllocationRecord, CardShare
from gpushare_hub.core.names import GPU_MEM_IDX, GPU_MEM_POD
from gpushare_hub.localcluster.pki import PKI
from tests.conftest import gpu_pod, wait_for
from tests.support.extender import (
    allocation,
    bound,
    check_no_overcommit_from_the_api_server,
    events_for,
    inspect,
    pods_in,
)

SCHED = "gpushare-scheduler"


def metric(metrics_url: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus sample over the series whose labels include ``labels``."""
    with urllib.request.urlopen(metrics_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.split()[-1])
    return total


def post(url: str, body: dict[str, Any], context: ssl.SSLContext | None = None) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10, context=context) as r:
        return json.loads(r.read())


def plain_pod(name: str, annotations: dict[str, str], node: str | None = None) -> dict[str, Any]:
    body = gpu_pod(name, 1)
    body["spec"]["containers"][0]["resources"] = {}
    body["metadata"]["annotations"] = annotations
    body["spec"]["schedulerName"] = "nobody-schedules-this"
    if node:
        body["spec"]["nodeName"] = node
    return body


def test_forged_allocations_hold_no_card_and_their_pods_get_a_warning(
    local_cluster, gpushare, node_group, namespace
):
    """As a user without the admission policy would: the ledger alone must not be fooled."""
    nodes, sel = node_group(1, cards=2)
    node = nodes[0]
    card0, card1 = f"GPU-sim-{node}-0", f"GPU-sim-{node}-1"
    api = local_cluster.core_api()
    whole = AllocationRecord(node, (CardShare(card0, 0, 15),), ()).to_json()
    negative = AllocationRecord(node, (CardShare(card0, 0, -10),), ()).to_json()
    # asks nothing and is not even scheduled, yet claims all of card 0
    api.create_namespaced_pod(namespace, plain_pod("idle", {"gpushare-hub.io/allocation": whole}))
    # asks 1 GiB, bound by hand, and claims -10 units: card 0 would look 25 GiB large
    neg = gpu_pod("negative", 1)
    neg["metadata"]["annotations"] = {"gpushare-hub.io/allocation": negative}
    neg["spec"]["nodeName"] = node
    api.create_namespaced_pod(namespace, neg)
    # gpushare's own annotations on a pod that asks nothing: card 1 blocked
    api.create_namespaced_pod(namespace, plain_pod("legacy", {GPU_MEM_IDX: "1", GPU_MEM_POD: "15"}, node))

    def ignored() -> dict[str, str]:
        return {
            i["pod"]: i["reason"]
            for i in inspect(gpushare.url)["ignored"]
            if i["pod"].startswith(namespace + "/")
        }

    assert wait_for(lambda: len(ignored()) == 3), ignored()
    assert ignored() == {
        f"{namespace}/idle": "no-demand",
        f"{namespace}/negative": "wrong-amount",
        f"{namespace}/legacy": "no-demand",
    }
    cards = inspect(gpushare.url, node)["nodes"][0]["cards"]
    assert [(c["used"], c["free"]) for c in cards] == [(0, 15), (0, 15)]
    for name in ("idle", "negative", "legacy"):
        msgs = wait_for(
            lambda name=name: [m for m in events_for(local_cluster, namespace, name) if "Ignored" in m]
        )
        assert msgs and "holds no card" in msgs[0], (name, events_for(local_cluster, namespace, name))
    assert (
        metric(gpushare.extender.metrics_url, "gpushare_ledger_ignored_records_total", reason="no-demand")
        >= 2
    )
    # Both cards still take a 14 GiB notebook each: nothing forged holds them.
    for i in range(2):
        api.create_namespaced_pod(namespace, gpu_pod(f"real-{i}", 14, SCHED, sel))

    def real_bound() -> list[dict[str, Any]] | None:
        got = [
            p for p in bound(local_cluster, namespace, 0) or [] if p["metadata"]["name"].startswith("real")
        ]
        return got if len(got) == 2 else None

    pods = wait_for(real_bound, timeout=60)
    assert pods, events_for(local_cluster, namespace, "real-1")
    assert sorted(allocation(p)["cards"][0]["uuid"] for p in pods) == [card0, card1]
    ledger = check_no_overcommit_from_the_api_server(local_cluster, nodes)
    assert {r.key for r in ledger.ignored()} >= {f"{namespace}/{n}" for n in ("idle", "negative", "legacy")}


def test_scheduler_binds_over_mutual_tls_and_strangers_are_refused(
    local_cluster, node_group, namespace, tmp_path
):
    """kube-scheduler's extender tlsConfig, as --print-scheduler-config writes it, against --tls-client-ca."""
    from gpushare_hub.extender.schedconfig import extender_entry, profile

    pki = PKI(tmp_path / "extender-pki")  # a CA for the extender's callers only
    serving = pki.issue("serving", "gpushare-extender", server=True, hosts=("127.0.0.1",))
    client = pki.issue("scheduler", "kube-scheduler")
    ext = local_cluster.start_extender(
        name="gpushare-extender-mtls",
        https=True,
        extra_args=[f"--tls-cert={serving.cert}", f"--tls-key={serving.key}", f"--tls-client-ca={pki.ca}"],
    )
    name = "gpushare-mtls"
    tls = {"certFile": str(client.cert), "keyFile": str(client.key), "caFile": str(pki.ca)}
    local_cluster.start_scheduler(
        name,
        extenders=[extender_entry(f"{ext.url}/gpushare-scheduler", tls_config=tls)],
        profile=profile(name),
    )
    nodes, sel = node_group(1, cards=2)
    api = local_cluster.core_api()
    api.create_namespaced_pod(namespace, gpu_pod("secure", 5, name, sel))
    pods = wait_for(lambda: bound(local_cluster, namespace, 1), timeout=60)
    assert pods and allocation(pods[0])["node"] == nodes[0], events_for(local_cluster, namespace, "secure")
    # Anyone else on the network: no client certificate, no TLS session, no bind.
    api.create_namespaced_pod(namespace, gpu_pod("target", 5, "nobody-schedules-this", sel))
    uid = api.read_namespaced_pod("target", namespace).metadata.uid
    anon = ssl.create_default_context(cafile=str(pki.ca))
    body = {"PodName": "target", "PodNamespace": namespace, "PodUID": uid, "Node": nodes[0]}
    try:
        post(f"{ext.url}/gpushare-scheduler/bind", body, anon)
        raise AssertionError("a caller without a client certificate could bind")
    except (ssl.SSLError, urllib.error.URLError, ConnectionError):
        pass
    assert api.read_namespaced_pod("target", namespace).spec.node_name is None
    # Prometheus needs nothing of that: /metrics is on its own plain port.
    assert metric(ext.metrics_url, "gpushare_extender_placements_total") == 1.0


def test_two_active_replicas_only_the_lease_holder_binds(local_cluster, node_group, namespace):
    """A Deployment of two extenders that both answer: each behind its own active kube-scheduler."""
    from gpushare_hub.extender.schedconfig import extender_entry, profile

    nodes, sel = node_group(1, cards=2)
    name = "gpushare-active"
    lease = f"gpushare-extender-{uuidlib.uuid4().hex[:6]}"
    election = [
        "--leader-elect",
        f"--lease-name={lease}",
        "--lease-namespace=kube-system",
        "--lease-duration=15",
        "--lease-renew-deadline=10",
        "--lease-retry-period=1",
    ]
    exts = []
    for replica in ("a", "b"):
        ext = local_cluster.start_extender(name=f"gpushare-extender-{name}-{replica}", extra_args=election)
        local_cluster.start_scheduler(
            name,
            extenders=[extender_entry(f"{ext.url}/gpushare-scheduler")],
            profile=profile(name),
            replica=replica,
        )
        exts.append(ext)
    holder = wait_for(
        lambda: (
            local_cluster.get_json(f"/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/{lease}")
            .get("spec", {})
            .get("holderIdentity")
        ),
        timeout=30,
    )
    assert holder
    api = local_cluster.core_api()
    for i in range(8):  # 8 x 5 GiB on 30 GiB: six fit, two must wait; no card may take more
        api.create_namespaced_pod(namespace, gpu_pod(f"act-{i}", 5, name, sel))
    assert wait_for(lambda: bound(local_cluster, namespace, 6), timeout=90)
    placed = [metric(e.metrics_url, "gpushare_extender_placements_total") for e in exts]
    assert sorted(placed) == [0.0, 6.0], placed
    leader, other = (exts[0], exts[1]) if placed[0] else (exts[1], exts[0])
    check_no_overcommit_from_the_api_server(local_cluster, nodes)
    # The other replica answers bind with an error naming the Lease, deterministically.
    pending = next(
        p
        for p in local_cluster.get_json(f"/api/v1/namespaces/{namespace}/pods")["items"]
        if not p["spec"].get("nodeName")
    )
    out = post(
        f"{other.url}/gpushare-scheduler/bind",
        {
            "PodName": pending["metadata"]["name"],
            "PodNamespace": namespace,
            "PodUID": pending["metadata"]["uid"],
            "Node": nodes[0],
        },
    )
    assert f"does not hold the Lease kube-system/{lease}" in out["Error"], out
    assert metric(other.metrics_url, "gpushare_extender_binds_refused_total", reason="not-leader") >= 1
    # The leader dies: the other takes the Lease over and binds the next pod.
    leader.kill()
    api.delete_namespaced_pod("act-0", namespace, grace_period_seconds=0)
    assert wait_for(
        lambda: (
            bound(local_cluster, namespace, 6)
            and metric(other.metrics_url, "gpushare_extender_placements_total") >= 1.0
        ),
        timeout=90,
    )
    check_no_overcommit_from_the_api_server(local_cluster, nodes)


def test_a_node_whose_card_inventory_is_unreadable_is_left_out_with_a_warning_on_it(
    local_cluster, gpushare, node_group, namespace
):
    """The Node's card declaration is an object in the cluster too: a mangled one takes the node out
    of placement (never its old cards), and the extender says why in a Warning event on the Node,
    where `kubectl describe node` shows it; the fixed annotation brings the node back."""
    nodes, sel = node_group(1, cards=2)
    node = nodes[0]
    api = local_cluster.core_api()
    good = api.read_node(node).metadata.annotations["gpushare-hub.io/cards"]
    api.patch_node(node, {"metadata": {"annotations": {"gpushare-hub.io/cards": '[{"uuid": 7}'}}})

    def warnings() -> list[str]:
        events = events_for(local_cluster, "default", node)
        return [m for m in events if m.startswith("GPUShareNodeUnreadable")]

    assert wait_for(warnings), events_for(local_cluster, "default", node)
    message = warnings()[0]  # one per extender of the session that reads this node
    assert f"node {node} annotation gpushare-hub.io/cards" in message and "no slice is placed" in message
    api.create_namespaced_pod(namespace, gpu_pod("waits", 5, SCHED, sel))
    assert wait_for(
        lambda: any("inventory is unreadable" in m for m in events_for(local_cluster, namespace, "waits"))
    ), events_for(local_cluster, namespace, "waits")
    assert not bound(local_cluster, namespace, 1)
    api.patch_node(node, {"metadata": {"annotations": {"gpushare-hub.io/cards": good}}})
    # kube-scheduler tries a pod it parked as unschedulable again only on cluster events its
    # plugins care about, and a Node's annotation is none of them: the parked pod waits for the
    # flush of parked pods (podMaxInUnschedulablePodsDuration, 5 minutes), a wait that ran to its
    # limit here (307 s on a loaded machine). What this test is about is the extender's side: the
    # node is placeable again at once, which a new pod (scheduled straight away) shows.
    api.delete_namespaced_pod("waits", namespace, grace_period_seconds=0)
    assert wait_for(lambda: not pods_in(local_cluster, namespace), timeout=60)
    api.create_namespaced_pod(namespace, gpu_pod("after-fix", 5, SCHED, sel))
    assert wait_for(lambda: bound(local_cluster, namespace, 1), timeout=90), events_for(
        local_cluster, namespace, "after-fix"
    )
