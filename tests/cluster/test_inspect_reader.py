"""The CLI's own reader (gpushare_hub.kube.rest) against the real kube-apiserver: it lists what
the ``kubernetes`` client lists, pages through long lists, and signs in with a service account's
token, directly or through an exec credential plugin, as EKS/GKE/AKS kubeconfigs do."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare_hub.core.report import build_report
from gpushare_hub.kube.kubeconfig import read_kubeconfig
from gpushare_hub.kube.rest import RestClient
from tests.conftest import gpu_pod, wait_for
from tests.objects import read_nodes, read_pods

SCHED = "gpushare-scheduler"
EXE = shutil.which("kubectl-inspect-gpushare", path=str(Path(sys.executable).parent))


def cli(kubeconfig: Path | str, *args: str) -> subprocess.CompletedProcess[str]:
    assert EXE, "the console script kubectl-inspect-gpushare is not installed beside this Python"
    return subprocess.run(
        [EXE, "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=60
    )


def client_lists(cluster: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes and Pods as the CLI read them before: the kubernetes client, its models serialised."""
    from kubernetes import client

    api = cluster.api_client()
    core = client.CoreV1Api(api)
    nodes = api.sanitize_for_serialization(core.list_node())["items"]
    pods = api.sanitize_for_serialization(core.list_pod_for_all_namespaces())["items"]
    return nodes, pods


def names(items: list[dict[str, Any]]) -> list[str]:
    return sorted(f"{i['metadata'].get('namespace', '')}/{i['metadata']['name']}" for i in items)


def test_the_cli_shows_what_the_kubernetes_client_lists(local_cluster, gpushare, node_group, namespace):
    _, sel = node_group(2, cards=2)
    api = local_cluster.core_api()
    for i, units in enumerate((3, 5, 7, 9, 15)):
        body = gpu_pod(f"nb-{i}", units, SCHED, sel)
        body["metadata"]["annotations"] = {"hub.jupyter.org/username": f"user{i}"}
        api.create_namespaced_pod(namespace, body)
    api.create_namespaced_pod(namespace, gpu_pod("nb-huge", 16, SCHED, sel))

    def settled() -> bool:
        pods = local_cluster.get_json(f"/api/v1/namespaces/{namespace}/pods")["items"]
        bound = [p for p in pods if p["spec"].get("nodeName")]
        return len(bound) == 5 and all(p.get("status", {}).get("phase") == "Running" for p in bound)

    assert wait_for(settled, timeout=90), "the five pods that fit were not all placed and running"

    def same() -> tuple[Any, Any] | None:
        res = cli(local_cluster.kubeconfig, "--json")
        assert res.returncode == 0, res.stderr
        ours = json.loads(res.stdout)
        nodes, pods = client_lists(local_cluster)
        theirs = build_report(read_nodes(nodes), read_pods(pods)).to_json()
        return None if ours != theirs else (ours, theirs)

    # kwok moves pods along on its own: the two reads agree once nothing moves between them
    agreed = wait_for(same, timeout=60, every=1.0)
    assert agreed, "kubectl-inspect-gpushare --json never matched the report of the kubernetes client's lists"
    ours, _ = agreed
    mine = [p for n in ours["nodes"] for c in n["cards"] for p in c["pods"] if p["namespace"] == namespace]
    assert sorted(p["units"] for p in mine) == [3, 5, 7, 9, 15]
    assert [p["name"] for p in ours["pending"] if p["namespace"] == namespace] == ["nb-huge"]


def test_lists_are_paged_and_equal_to_the_kubernetes_clients(local_cluster, namespace):
    api = local_cluster.core_api()
    for i in range(7):
        api.create_namespaced_pod(namespace, gpu_pod(f"p-{i}", 1, "no-such-scheduler"))
    with RestClient(read_kubeconfig(str(local_cluster.kubeconfig))) as reader:
        asked: list[dict[str, str]] = []
        get = reader.get
        reader.get = lambda path, query=None: asked.append(dict(query or {})) or get(path, query)  # type: ignore[method-assign]
        paged = reader.list(f"/api/v1/namespaces/{namespace}/pods", page=2)
        # the API server itself cut the list: four answers of at most 2, each after the first
        # continuing from the token the one before gave
        assert [q.get("limit") for q in asked] == ["2"] * 4
        assert ["continue" in q for q in asked] == [False, True, True, True]
        reader.get = get  # type: ignore[method-assign]
        nodes = reader.list("/api/v1/nodes", page=1)
        one = reader.list("/api/v1/nodes", {"fieldSelector": f"metadata.name={nodes[0]['metadata']['name']}"})
    assert names(paged) == [f"{namespace}/p-{i}" for i in range(7)]
    theirs_nodes, theirs_pods = client_lists(local_cluster)
    assert names(nodes) == names(theirs_nodes)
    assert names(paged) == [n for n in names(theirs_pods) if n.startswith(f"{namespace}/")]
    assert names(one) == names(nodes[:1])


@pytest.fixture
def service_account(local_cluster, namespace):
    """A service account of ``namespace`` that may (``reader``) or may not list nodes and pods,
    and a token of it from the TokenRequest API; the cluster-wide RBAC objects go afterwards."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(local_cluster.api_client())
    core = local_cluster.core_api()
    made: list[str] = []

    def make(reader: bool) -> str:
        name = f"sa-{uuid.uuid4().hex[:6]}"
        core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
        if reader:
            rbac.create_cluster_role(
                {
                    "metadata": {"name": name},
                    "rules": [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list"]}],
                }
            )
            rbac.create_cluster_role_binding(
                {
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
                }
            )
            made.append(name)
        request = {"spec": {"expirationSeconds": 600}}
        return str(core.create_namespaced_service_account_token(name, namespace, request).status.token)

    yield make
    for name in made:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def token_kubeconfig(cluster: Any, path: Path, user: dict[str, Any]) -> Path:
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    ca = base64.b64encode(Path(admin["clusters"][0]["cluster"]["certificate-authority"]).read_bytes())
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "local",
                "cluster": {
                    "server": cluster.server,
                    "certificate-authority-data": ca.decode(),
                },
            }
        ],
        "users": [{"name": "sa", "user": user}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": "sa"}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_service_account_token_signs_in_and_a_missing_permission_is_named(
    local_cluster, service_account, tmp_path
):
    reader = token_kubeconfig(local_cluster, tmp_path / "reader.kc", {"token": service_account(True)})
    res = cli(reader, "--json")
    assert res.returncode == 0, res.stderr
    assert {n["name"] for n in json.loads(res.stdout)["nodes"]} >= {"gpu-1", "gpu-2", "gpu-3"}

    nobody = token_kubeconfig(local_cluster, tmp_path / "nobody.kc", {"token": service_account(False)})
    res = cli(nobody)
    assert res.returncode == 1
    assert res.stderr.strip() == (
        f"kubectl-inspect-gpushare: the API server at {local_cluster.server} refused (403 Forbidden); "
        "this needs list on nodes and on pods in all namespaces (kubectl auth can-i list pods -A)"
    )


def test_an_exec_credential_plugin_signs_in(local_cluster, service_account, tmp_path):
    token = service_account(True)
    plugin = tmp_path / "get-token"
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": token},
    }
    plugin.write_text(f"#!{sys.executable}\nprint({json.dumps(json.dumps(credential))})\n")
    plugin.chmod(0o755)
    exec_user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "./get-token",
            "interactiveMode": "Never",
        }
    }
    kc = token_kubeconfig(local_cluster, tmp_path / "exec.kc", exec_user)
    res = cli(kc, "gpu-1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[1].split()[0] == "gpu-1"
