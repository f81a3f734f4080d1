"""`kubectl-inspect-gpushare` against the real API server, with pods the extender placed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import gpu_pod, wait_for
from tests.support.inspect_cluster import columns

SCHED = "gpushare-scheduler"


def run_cli(cluster, *args: str) -> str:
    exe = shutil.which("kubectl-inspect-gpushare", path=str(Path(sys.executable).parent))
    assert exe, "the console script kubectl-inspect-gpushare is not installed beside this Python"
    res = subprocess.run(
        [exe, "--kubeconfig", str(cluster.kubeconfig), *args], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_inspect_shows_placed_pods_per_card_and_a_pod_waiting_for_a_fitting_card(
    local_cluster, gpushare, node_group, namespace
):
    names, sel = node_group(1, cards=2)
    node = names[0]
    api = local_cluster.core_api()
    for name, units in (("nb-a", 5), ("nb-b", 5), ("nb-c", 7)):
        body = gpu_pod(name, units, SCHED, sel)
        body["metadata"]["annotations"] = {"hub.jupyter.org/username": name.removeprefix("nb-")}
        api.create_namespaced_pod(namespace, body)
    api.create_namespaced_pod(namespace, gpu_pod("nb-huge", 16, SCHED, sel))

    def placed():
        pods = local_cluster.get_json(f"/api/v1/namespaces/{namespace}/pods")["items"]
        return (
            [p for p in pods if p["spec"].get("nodeName")]
            if sum(1 for p in pods if p["spec"].get("nodeName")) == 3
            else None
        )

    assert wait_for(placed, timeout=60), "the three pods that fit were not all placed"

    def huge_reason():
        data = json.loads(run_cli(local_cluster, "--json"))
        mine = [p for p in data["pending"] if p["namespace"] == namespace]
        return mine if mine and mine[0].get("reason") not in ("", "not scheduled yet") else None

    pending = wait_for(huge_reason, timeout=60)
    assert pending and pending[0]["name"] == "nb-huge" and pending[0]["units"] == 16, pending

    data = json.loads(run_cli(local_cluster, "--json", node))
    (n,) = data["nodes"]
    held = sorted(
        (c["index"], p["name"], p["units"], p.get("hub_user")) for c in n["cards"] for p in c["pods"]
    )
    # binpack: both 5 GiB slices share one card, the 7 GiB one fills the other or the same card
    assert sorted(u for _, _, u, _ in held) == [5, 5, 7]
    assert {h[3] for h in held} == {"a", "b", "c"}
    assert n["used"] == 17 and n["total"] == 30

    summary = run_cli(local_cluster, node).splitlines()
    rows = columns(summary[:2])
    assert rows[0] == ["NAME", "IPADDRESS", "GPU0(Allocated/Total)", "GPU1(Allocated/Total)", "GPU Memory"]
    per_card = {c["index"]: f"{c['used']}/{c['units']}" for c in n["cards"]}
    assert rows[1][0] == node and rows[1][2:] == [per_card[0], per_card[1], "17/30"]

    detail = run_cli(local_cluster, "-d", node).splitlines()
    start = detail.index(f"NAME:       {node}")
    table = columns(detail[start + 3 : start + 7])
    assert table[0] == ["NAME", "NAMESPACE", "GPU0(Allocated)", "GPU1(Allocated)", "HUB USER"]
    assert sorted(r[0] for r in table[1:]) == ["nb-a", "nb-b", "nb-c"]
    assert all(r[1] == namespace for r in table[1:])

    everything = run_cli(local_cluster)
    assert "Pending GPU pods (not placed on any node):" in everything
    line = next(x for x in everything.splitlines() if x.startswith("nb-huge") and namespace in x)
    assert "16" in line.split()
