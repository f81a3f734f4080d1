"""`kubectl inspect gpushare`: Aliyun's tables, column for column, from the shared ledger."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gpushare_hub.core.cards import declared_cards
from gpushare_hub.core.names import (
    CARDS_ANNOTATION,
    USAGE_ANNOTATION,
)
from gpushare_hub.core.objects import NodeObject, PodObject
from gpushare_hub.core.report import build_report
from gpushare_hub.inspect import cli
from gpushare_hub.inspect.render import details, summary
from gpushare_hub.inspect.tabwriter import tabulate
from tests.objects import read_nodes, read_pods
from tests.support.inspect_cluster import columns, fixture_cluster
from tests.unit import fakeapi

# Each expected text below is what Go's text/tabwriter, set up as Aliyun's tool sets it up
# (NewWriter(w, 0, 0, 2, ' ', 0)), printed for the input (checked with go1.26).
GO_TABWRITER = [
    (
        "NAME\tIPADDRESS\tGPU0(Allocated/Total)\tGPU Memory\nnode-a\t127.0.0.1\t3/15\t3/15\n----\n"
        "Allocated/Total GPU Memory In Cluster:\n3/15 (20%)\t\n",
        "NAME    IPADDRESS  GPU0(Allocated/Total)  GPU Memory\n"
        "node-a  127.0.0.1  3/15                   3/15\n"
        "----\nAllocated/Total GPU Memory In Cluster:\n3/15 (20%)  \n",
    ),
    (
        "NAME:\tn\nIPADDRESS:\tunknown\n\nNAME\tNAMESPACE\tGPU0(Allocated)\t\np\tns\t3\t\n"
        "Allocated :\t3 (20%)\t\nTotal :\t15 \t\n",
        "NAME:       n\nIPADDRESS:  unknown\n\nNAME         NAMESPACE  GPU0(Allocated)  \n"
        "p            ns         3                \nAllocated :  3 (20%)    \nTotal :      15         \n",
    ),
    (
        "a\tbb\tccc\n\tdddd\te\nlonger-name\t\n",
        "a            bb    ccc\n             dddd  e\nlonger-name  \n",
    ),
    ("x\ty\t", "x  y"),
]


@pytest.mark.parametrize(("text", "expected"), GO_TABWRITER)
def test_columns_are_laid_out_as_go_tabwriter_does(text, expected):
    assert tabulate(text) == expected


def read_cluster() -> tuple[list[NodeObject], list[PodObject]]:
    nodes, pods = fixture_cluster()
    return read_nodes(nodes), read_pods(pods)


def test_summary_has_aliyuns_columns_and_the_ledgers_numbers():
    out = summary(build_report(*read_cluster())).splitlines()
    rows = columns(out[:3])
    assert rows == [
        [
            "NAME",
            "IPADDRESS",
            "GPU0(Allocated/Total)",
            "GPU1(Allocated/Total)",
            "PENDING(Allocated)",
            "GPU Memory",
        ],
        ["gpu-a", "10.0.0.1", "10/15", "7/15", "", "17/30"],
        ["gpu-b", "unknown", "0/15", "3/15", "2", "5/30"],
    ]
    # Aliyun's rule: as long as the first node's raw line plus 20.
    assert out[3] == "-" * (len("gpu-a\t10.0.0.1\t10/15\t7/15\t\t17/30\n") + 20)
    assert out[4:6] == ["Allocated/Total GPU Memory In Cluster:", "22/60 (36%)  "]
    assert "cpu-1" not in "\n".join(out)
    assert "finished" not in "\n".join(out)
    pending = out[out.index("Pending GPU pods (not placed on any node):") + 1 :]
    assert columns(pending) == [
        ["NAME", "NAMESPACE", "GiB", "REASON"],
        ["jupyter-dave", "jhub", "16", "0/2 nodes are available: 2 no card has 16 GiB free."],
    ]


def test_details_lists_each_nodes_pods_per_card_with_the_hub_user_last():
    out = details(build_report(*read_cluster())).splitlines()
    assert out[:3] == ["", "NAME:       gpu-a", "IPADDRESS:  10.0.0.1"]
    a = columns(out[4:8])
    assert a == [
        ["NAME", "NAMESPACE", "GPU0(Allocated)", "GPU1(Allocated)", "HUB USER"],
        ["jupyter-alice", "jhub", "5", "0", "alice"],
        ["jupyter-bob", "jhub", "5", "0", "bob/big"],
        ["jupyter-carol", "jhub", "0", "7", "carol"],
    ]
    assert out[8].split() == ["Allocated", ":", "17", "(56%)"]
    assert out[9].split() == ["Total", ":", "30"]
    b_start = out.index("NAME:       gpu-b")
    b = columns(out[b_start + 3 : b_start + 6])
    assert b == [
        ["NAME", "NAMESPACE", "GPU0(Allocated)", "GPU1(Allocated)", "Pending(Allocated)", "HUB USER"],
        ["legacy", "jhub", "0", "3", "0", ""],
        ["bypassed", "jhub", "0", "0", "2", ""],
    ]
    assert "Allocated/Total GPU Memory In Cluster:  22/60 (36%)  " in out


def test_json_carries_cards_pods_hub_users_and_reasons():
    data = build_report(*read_cluster()).to_json()
    json.dumps(data)
    assert (data["used"], data["total"], data["unit"]) == (22, 60, "GiB")
    a = data["nodes"][0]
    assert [c["free"] for c in a["cards"]] == [5, 8]
    assert a["cards"][0]["pods"][1] == {
        "namespace": "jhub",
        "name": "jupyter-bob",
        "units": 5,
        "hub_user": "bob",
        "hub_server": "big",
    }
    assert data["nodes"][1]["unplaced"] == [{"namespace": "jhub", "name": "bypassed", "units": 2}]
    assert data["pending"][0]["reason"].startswith("0/2 nodes are available")


def test_a_node_whose_inventory_is_unreadable_is_named_with_the_reason():
    nodes, pods = fixture_cluster()
    nodes[1]["metadata"]["annotations"][CARDS_ANNOTATION] = "not json"
    report = build_report(read_nodes(nodes), read_pods(pods))
    out = summary(report)
    assert "Nodes whose GPU inventory cannot be read (not counted above):" in out
    line = next(x for x in out.splitlines() if x.startswith("gpu-b"))
    assert "card inventory unreadable" in line
    assert report.total == 30


def test_one_node_only():
    report = build_report(*read_cluster(), only_node="gpu-b")
    assert [n.name for n in report.nodes] == ["gpu-b"]
    assert report.pending == ()


def test_the_cli_says_how_to_reach_a_cluster_when_there_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SystemExit, match="set KUBECONFIG or pass --kubeconfig"):
        cli.main([])


def test_the_cli_names_an_unusable_kubeconfig_or_an_unreachable_server_without_a_traceback(tmp_path, capsys):
    import pytest

    from gpushare_hub.inspect.cli import main

    garbage = tmp_path / "garbage.kc"
    garbage.write_text("clusters: [")
    dead = tmp_path / "dead.kc"
    dead.write_text(
        "apiVersion: v1\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    for kubeconfig, words in [
        (tmp_path / "missing.kc", "no such file"),
        (garbage, "not a kubeconfig (not YAML"),
        (dead, "cannot reach the API server at https://127.0.0.1:1"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main(["--kubeconfig", str(kubeconfig)])
        assert "kubectl-inspect-gpushare: " in str(exit_.value) and words in str(exit_.value), exit_.value


pki = fakeapi.pki  # fixtures: a loopback API server
apiserver = fakeapi.apiserver


def api_kubeconfig(path, server: str, ca: str, token: str) -> str:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "clusters": [
                    {"name": "dead", "cluster": {"server": "https://127.0.0.1:1"}},
                    {"name": "fake", "cluster": {"server": server, "certificate-authority": ca}},
                ],
                "contexts": [
                    {"name": "dead", "context": {"cluster": "dead", "user": "u"}},
                    {"name": "fake", "context": {"cluster": "fake", "user": "u"}},
                ],
                "current-context": "dead",
                "users": [{"name": "u", "user": {"token": token}}],
            }
        )
    )
    return str(path)


def test_the_cli_reads_nodes_and_pods_from_the_api_server_it_is_given(tmp_path, capsys, apiserver, pki):
    nodes, pods = fixture_cluster()
    apiserver.lists["/api/v1/nodes"], apiserver.lists["/api/v1/pods"] = nodes, pods
    kc = api_kubeconfig(tmp_path / "kc", apiserver.server, str(pki.ca), "good-token")
    assert cli.main(["--kubeconfig", kc, "--context", "fake", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == build_report(read_nodes(nodes), read_pods(pods)).to_json()
    assert [path for path, *_ in apiserver.requests] == [
        "/prefix/api/v1/nodes",
        "/prefix/apis/resource.k8s.io/v1/resourceclaims",  # not served here: 404, left out
        "/prefix/api/v1/pods",
    ]
    assert cli.main(["--kubeconfig", kc, "--context", "fake", "gpu-b"]) == 0
    assert capsys.readouterr().out == summary(
        build_report(read_nodes(nodes), read_pods(pods), only_node="gpu-b")
    )
    assert apiserver.requests[-1][1]["fieldSelector"] == ["spec.nodeName=gpu-b"]


@pytest.mark.parametrize(
    ("token", "forbid", "status"),
    [("bad-token", False, "401 Unauthorized"), ("good-token", True, "403 Forbidden")],
)
def test_the_cli_names_a_refusal_and_what_it_needs(tmp_path, apiserver, pki, token, forbid, status):
    apiserver.forbid = forbid
    kc = api_kubeconfig(tmp_path / "kc", apiserver.server, str(pki.ca), token)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--kubeconfig", kc, "--context", "fake"])
    assert str(exit_.value) == (
        f"kubectl-inspect-gpushare: the API server at {apiserver.server} refused ({status}); "
        "this needs list on nodes and on pods in all namespaces (kubectl auth can-i list pods -A)"
    )


def test_the_cli_names_a_missing_context_or_node(tmp_path, apiserver, pki):
    kc = api_kubeconfig(tmp_path / "kc", apiserver.server, str(pki.ca), "good-token")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--kubeconfig", kc, "--context", "typo"])
    assert str(exit_.value) == (
        f"kubectl-inspect-gpushare: --kubeconfig {kc}: no context 'typo' in it (contexts: dead, fake)"
    )
    with pytest.raises(SystemExit, match="node 'gpu-z' not found"):
        cli.main(["--kubeconfig", kc, "--context", "fake", "gpu-z"])


def test_the_cli_imports_no_kubernetes_client():
    code = (
        "import sys, gpushare_hub.inspect.cli; "
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('kubernetes', 'kubernetes_asyncio', 'aiohttp', 'tornado', 'jupyterhub', 'urllib3') "
        "or m == 'gpushare_hub.kube.informer']; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_details_add_what_each_slice_holds_and_does_where_the_plugin_measures_it():
    nodes, pods = fixture_cluster()
    now = 1_800_000_000
    uid = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
    card0, card1 = (c.uuid for c in declared_cards("gpu-a", 2, "Tesla T4", 15360))
    nodes[0]["metadata"]["annotations"][USAGE_ANNOTATION] = json.dumps(
        {
            "pods": [
                {
                    "pod": "jhub/jupyter-alice",
                    "uid": uid["jupyter-alice"],
                    "card": card0,
                    "usedMiB": 6963,
                    "sliceMiB": 5120,
                    "smUtil": 37,
                    "idleSince": None,
                },
                {
                    "pod": "jhub/jupyter-bob",
                    "uid": uid["jupyter-bob"],
                    "card": card0,
                    "usedMiB": 600,
                    "sliceMiB": 5120,
                    "smUtil": 0,
                    "idleSince": now - 7500,
                },
                {
                    "pod": "jhub/jupyter-carol",
                    "uid": uid["jupyter-carol"],
                    "card": card1,
                    "usedMiB": 0,
                    "sliceMiB": 7168,
                    "smUtil": None,
                    "idleSince": None,
                },
            ],
            "cards": {},
        }
    )
    report = build_report(read_nodes(nodes), read_pods(pods))
    out = details(report, now=now).splitlines()
    a = columns(out[4:8])
    assert [row[4:] for row in a] == [
        ["HUB USER", "GPU MEM USED", "GPU UTIL", "GPU IDLE"],
        ["alice", "6.8 GiB over", "37%", "-"],
        ["bob/big", "0.6 GiB", "0%", "2h05m"],
        ["carol", "0.0 GiB", "n/a", "n/a"],  # the card does not sample utilisation
    ]
    b_start = out.index("NAME:       gpu-b")  # its plugin publishes no usage
    b = columns(out[b_start + 3 : b_start + 5])
    assert b[0][-3:] == ["GPU MEM USED", "GPU UTIL", "GPU IDLE"] and b[1][-3:] == ["n/a", "n/a", "n/a"]
    alice = report.to_json()["nodes"][0]["cards"][0]["pods"][0]
    assert (alice["used_mib"], alice["over_slice"], alice["sm_util"], alice["idle_since"]) == (
        6963,
        True,
        37,
        None,
    )
    # Without any measuring node, the table is Aliyun's (the test above).
    assert "GPU UTIL" not in details(build_report(*read_cluster()))
