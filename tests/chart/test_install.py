"""The chart in a real control plane: server-side dry run, install, RBAC, admission, uninstall.

kube-controller-manager turns the Deployment and DaemonSet into pods, the default scheduler
places them on kwok nodes (which "run" them: the images need not exist). The rendered
KubeSchedulerConfiguration is then loaded by the real kube-scheduler binary acting as the
chart's scheduler account, calling an extender that acts as the chart's extender account
(its token Secret), and a GPU pod is placed.
"""

from __future__ import annotations

import base64
import json
import shlex
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from gpushare_hub.core.names import (
    ALLOCATION_ANNOTATION,
    CARDS_ANNOTATION,
    GPU_MEM_ASSIGNED,
    GPU_MEM_ASSUME_TIME,
    GPU_MEM_DEV,
    GPU_MEM_IDX,
    GPU_MEM_POD,
    MPS_LABEL,
    MPS_MULTI_USER_LABEL,
)
from gpushare_hub.localcluster.cluster import LocalCluster
from gpushare_hub.localcluster.pki import PKI
from gpushare_hub.localcluster.processes import Component, free_port
from tests.conftest import gpu_pod, wait_for
from tests.doccommands import doc_block, option, substitute

from .conftest import CHART_EXAMPLES, Helm
from .docrun import Kubectl, run_block

NS = "gpushare-hub"
RELEASE = "gpushare-hub"
HUB_NS = "jupyterhub"  # docs/install.md: hub.serviceAccount.namespace
LAB_NS = "lab"  # where a notebook placed by Aliyun's extender runs before the migration
OLD_POD = "old-notebook"
ALIYUN_IMAGES = "registry.cn-hangzhou.aliyuncs.com/acs"
# The docs' placeholders, as the chart tier fills them in (docs/README.md#how-these-pages-are-tested).
PLACEHOLDERS = {"<gpu-node-1>": "gpu-1", "<gpu-node-2>": "gpu-2", "<registry>": "ghcr.io/gpushare-hub"}


def doc_values(*blocks: str) -> list[str]:
    """The --set and --set-json of the docs' helm commands in these blocks, filled in, in order."""
    out = []
    for name in blocks:
        for argv in doc_block(name).commands():
            if argv[0] == "helm":
                argv = substitute(argv, PLACEHOLDERS)
                out += [f"--set={v}" for v in option(argv, "--set")]
                out += [f"--set-json={v}" for v in option(argv, "--set-json")]
    return out


# What the docs install: docs/install.md, then MPS from docs/isolation.md.
INSTALL_VALUES = doc_values("install", "mps")


MPS_NODES = {
    "gpu-1": {MPS_LABEL: "true"},
    "gpu-2": {MPS_LABEL: "true", MPS_MULTI_USER_LABEL: "true"},
}


def sa(name: str, namespace: str = NS) -> tuple[str, list[str]]:
    user = f"system:serviceaccount:{namespace}:{name}"
    return user, ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"]


def aliyun_stand_ins(cluster: LocalCluster) -> Any:
    """What an Aliyun gpushare install leaves in a cluster (its manifests' names), and a notebook
    its extender placed on gpu-1's card 0 (annotations only: no gpushare-hub.io/allocation)."""
    api = cluster.api_client()
    core, apps, rbac = client.CoreV1Api(api), client.AppsV1Api(api), client.RbacAuthorizationV1Api(api)
    labels = {"app": "gpushare", "component": "gpushare-device-plugin"}
    template = {
        "metadata": {"labels": labels},
        "spec": {
            "containers": [
                {
                    "name": "gpushare",
                    "image": f"{ALIYUN_IMAGES}/k8s-gpushare-plugin:v2-1.11-aff8a23",
                }
            ]
        },
    }
    apps.create_namespaced_daemon_set(
        "kube-system",
        {
            "metadata": {"name": "gpushare-device-plugin-ds"},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {**template, "spec": {**template["spec"], "nodeSelector": {"gpushare": "true"}}},
            },
        },
    )
    ext = {"app": "gpushare", "component": "gpushare-schd-extender"}
    apps.create_namespaced_deployment(
        "kube-system",
        {
            "metadata": {"name": "gpushare-schd-extender"},
            "spec": {
                "selector": {"matchLabels": ext},
                "template": {
                    "metadata": {"labels": ext},
                    "spec": {
                        "containers": [
                            {
                                "name": "gpushare-schd-extender",
                                "image": f"{ALIYUN_IMAGES}/k8s-gpushare-schd-extender:1.11-d170d8a",
                            }
                        ]
                    },
                },
            },
        },
    )
    core.create_namespaced_service(
        "kube-system",
        {
            "metadata": {"name": "gpushare-schd-extender"},
            "spec": {"selector": ext, "ports": [{"port": 12345, "name": "http"}]},
        },
    )
    core.create_namespaced_service_account("kube-system", {"metadata": {"name": "gpushare-device-plugin"}})
    rbac.create_cluster_role(
        {
            "metadata": {"name": "gpushare-device-plugin"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": "gpushare-device-plugin"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "gpushare-device-plugin",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "gpushare-device-plugin", "namespace": "kube-system"}
            ],
        }
    )
    pod = gpu_pod(OLD_POD, 5, nodeName="gpu-1")
    pod["metadata"]["annotations"] = {
        GPU_MEM_IDX: "0",
        GPU_MEM_POD: "5",
        GPU_MEM_DEV: "15",
        GPU_MEM_ASSIGNED: "true",
        GPU_MEM_ASSUME_TIME: str(time.time_ns()),
    }
    return core.create_namespaced_pod(LAB_NS, pod)


class Installed:
    """The chart installed as the docs say: the Aliyun migration's steps, then the install, its
    check and the MPS upgrade, every command read from docs/*.md (tests/chart/docrun.py)."""

    def __init__(self, cluster: LocalCluster, helm: Helm) -> None:
        self.cluster = cluster
        self.helm = helm
        self.admin = cluster.core_api()
        self.api = cluster.api_client()
        self.kubectl = Kubectl(cluster.kubeconfig)
        self.docs = helm.template(*INSTALL_VALUES, namespace=NS, release=RELEASE)
        for ns in ("alice", LAB_NS):  # the install block makes the hub's namespace (HUB_NS)
            cluster.create_namespace(ns)
        self.old_pod = aliyun_stand_ins(cluster)
        (self.found,) = self.run_doc("aliyun-find")
        self.run_doc("aliyun-remove")
        # As the device plugin labels MPS nodes (the nodeOptions mps, mpsMultiUser of docs/isolation.md).
        for node, labels in MPS_NODES.items():
            self.admin.patch_node(node, {"metadata": {"labels": labels}})
        # The RuntimeClass the GPU Operator creates (the install names it for the plugin's pod).
        client.NodeV1Api(self.api).create_runtime_class(
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": "nvidia"},
                "handler": "nvidia",
            }
        )
        _, _, self.install_output = self.run_doc("install")
        self.node_check, self.inspect = self.run_doc("install-check")
        self.run_doc("mps")
        (self.inspect_after_migration,) = self.run_doc("aliyun-check")
        self.uninstalled = False

    def run_doc(self, block: str) -> list[str]:
        """Run the docs' chart-tier block of that name (tests/unit/test_docs.py reads these names)."""
        return run_block(doc_block(block), self.helm.binary, self.kubectl, PLACEHOLDERS)

    def pods(self, component: str) -> list[Any]:
        selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
        return list(self.admin.list_namespaced_pod(NS, label_selector=selector).items)

    def kubeconfig_with_token(self, name: str, token: str) -> Path:
        cfg = yaml.safe_load(self.cluster.kubeconfig.read_text())
        cfg["users"] = [{"name": cfg["users"][0]["name"], "user": {"token": token}}]
        path = self.cluster.workdir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        return path


@pytest.fixture(scope="module")
def installed(chart_cluster: LocalCluster, helm: Helm) -> Iterator[Installed]:
    inst = Installed(chart_cluster, helm)
    yield inst
    if not inst.uninstalled:
        helm.run("uninstall", RELEASE, f"--namespace={NS}", kubeconfig=chart_cluster.kubeconfig, check=False)


def test_every_rendered_manifest_passes_a_server_side_dry_run(chart_cluster: LocalCluster, helm: Helm):
    """Defaults and every example values file, into a namespace of their own, persisting nothing."""
    chart_cluster.create_namespace("dry-run")
    dyn = dynamic.DynamicClient(chart_cluster.api_client())
    refused = []
    rendered = {
        values: helm.template(*([f"--values={values}"] if values else []), namespace="dry-run")
        for values in (None, *CHART_EXAMPLES)
    }
    # Objects the chart puts in the hub's namespace (hub.serviceAccount.namespace, which exists
    # wherever the hub runs) go into a namespace of the dry run's own: the installs below make
    # the hub's namespace themselves.
    chart_cluster.create_namespace("dry-run-hub")
    for values, docs in rendered.items():
        for doc in docs:
            if doc["metadata"].get("namespace") not in (None, "dry-run"):
                doc["metadata"]["namespace"] = "dry-run-hub"
            resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            namespace = doc["metadata"].get("namespace", "dry-run") if resource.namespaced else None
            try:
                resource.create(body=doc, namespace=namespace, dry_run="All")
            except ApiException as err:
                refused.append(f"{values}: {doc['kind']}/{doc['metadata']['name']}: {err.status} {err.body}")
    assert not refused, "\n".join(refused)
    assert chart_cluster.get_json("/api/v1/namespaces/dry-run/configmaps")["items"] == [] or all(
        cm["metadata"]["name"] == "kube-root-ca.crt"
        for cm in chart_cluster.get_json("/api/v1/namespaces/dry-run/configmaps")["items"]
    )


def test_workloads_get_their_pods_on_the_right_nodes(installed: Installed):
    schedulers = installed.pods("scheduler")
    plugins = installed.pods("device-plugin")
    assert len(schedulers) == 2 and all(p.spec.node_name for p in schedulers)
    assert sorted(p.spec.node_name for p in plugins) == ["gpu-1", "gpu-2"]  # not cpu-1: no gpushare=true
    assert all(p.status.phase == "Running" for p in schedulers + plugins)


def test_one_mps_control_daemon_per_mps_node_multi_user_where_labelled(installed: Installed):
    single = installed.pods("mps-control-daemon")
    multi = installed.pods("mps-control-daemon-multi-user")
    assert [p.spec.node_name for p in single] == ["gpu-1"]  # not gpu-2 (multi-user), not cpu-1
    assert [p.spec.node_name for p in multi] == ["gpu-2"]
    assert all(p.status.phase == "Running" for p in single + multi)
    env = {e.name: e.value for e in multi[0].spec.containers[0].env}
    assert env["MPS_MULTI_USER"] == "true"
    # No API access at all: no token in the pod, no rights for its account.
    assert not [v for p in single + multi for v in p.spec.volumes if v.projected]
    user, groups = sa("gpushare-mps-control-daemon")
    assert not [r for r in ALL_MUST if review(installed.api, user, groups, *r)]


def test_the_sidecar_sees_only_the_extenders_token_and_the_scheduler_only_its_own(installed: Installed):
    """The API server's ServiceAccount admission leaves a container's own mount at the token path alone."""
    token_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    pod = installed.pods("scheduler")[0]
    volumes = {v.name: v for v in pod.spec.volumes}
    for container in pod.spec.containers:
        (mount,) = [m for m in container.volume_mounts if m.mount_path == token_path]
        volume = volumes[mount.name]
        if container.name == "extender":
            assert volume.secret.secret_name == "gpushare-extender-token"
        else:
            assert volume.projected is not None and pod.spec.service_account_name == "gpushare-scheduler"


def test_install_prints_the_next_steps(installed: Installed):
    notes = installed.install_output
    assert "kubectl label node <node> gpushare=true" in notes
    assert "examples/z2jh-values.yaml" in notes
    # The notes' node check is the docs' (docs/install.md, "Check it"), quoted for a shell.
    (check,) = [shlex.split(line) for line in notes.splitlines() if "custom-columns" in line]
    assert check == doc_block("install-check").commands()[0]


def rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines() if line.strip()]


def test_the_docs_node_check_lists_each_labelled_node_with_its_slices(installed: Installed):
    """docs/install.md, "Check it": two T4s per node, 15 GiB each."""
    assert rows(installed.node_check) == [["NODE", "SLICES"], ["gpu-1", "30"], ["gpu-2", "30"]]
    assert "Allocated/Total GPU Memory In Cluster" in installed.inspect


def test_the_aliyun_migration_finds_the_old_pod_and_installs_around_its_card(installed: Installed):
    """docs/migrating-from-aliyun.md: the old pod is listed, the old objects are gone, and after
    the install the ledger counts its card (inspect -d lists it under gpu-1's card 0)."""
    assert [LAB_NS, OLD_POD, "gpu-1", "0", "5", "true"] in rows(installed.found)
    apps = client.AppsV1Api(installed.api)
    gone = [
        lambda: apps.read_namespaced_daemon_set("gpushare-device-plugin-ds", "kube-system"),
        lambda: apps.read_namespaced_deployment("gpushare-schd-extender", "kube-system"),
        lambda: installed.admin.read_namespaced_service("gpushare-schd-extender", "kube-system"),
        lambda: installed.admin.read_namespaced_service_account("gpushare-device-plugin", "kube-system"),
    ]
    for read in gone:
        with pytest.raises(ApiException) as err:
            read()
        assert err.value.status == 404
    # The chart's own ClusterRole of that name now belongs to the release.
    role = client.RbacAuthorizationV1Api(installed.api).read_cluster_role("gpushare-device-plugin")
    assert (role.metadata.annotations or {}).get("meta.helm.sh/release-name") == RELEASE
    out = installed.inspect_after_migration
    section = out[out.index("gpu-1") :]
    (line,) = [r for r in rows(section) if r and r[0] == OLD_POD][:1]
    assert line[:3] == [OLD_POD, LAB_NS, "5"], out
    assert installed.admin.read_namespaced_pod(OLD_POD, LAB_NS).spec.node_name == "gpu-1"


def review(
    api: Any,
    user: str,
    groups: list[str],
    verb: str,
    resource: str,
    namespace: str = "",
    group: str = "",
    subresource: str = "",
    name: str = "",
) -> bool:
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": groups,
            "resourceAttributes": {
                "verb": verb,
                "resource": resource,
                "group": group,
                "namespace": namespace,
                "subresource": subresource,
                "name": name,
            },
        },
    }
    return bool(client.AuthorizationV1Api(api).create_subject_access_review(body).status.allowed)


# (verb, resource, namespace, group, subresource, name)
RIGHTS: dict[str, tuple[list[tuple[str, ...]], list[tuple[str, ...]]]] = {
    "gpushare-extender": (
        [
            ("list", "nodes"),
            ("watch", "pods"),
            ("get", "pods", "alice"),
            ("create", "pods", "alice", "", "binding"),
            ("create", "events", "alice"),
            ("patch", "events", "alice", "events.k8s.io"),
            ("update", "leases", NS, "coordination.k8s.io"),
        ],
        [
            ("patch", "pods", "alice"),
            ("create", "pods", "alice"),
            ("delete", "pods", "alice"),
            ("patch", "nodes"),
            ("get", "secrets", NS),
            ("list", "secrets"),
            ("get", "configmaps", NS),
            ("update", "leases", "kube-system", "coordination.k8s.io"),
            ("create", "serviceaccounts", NS, "", "token"),
        ],
    ),
    "gpushare-device-plugin": (
        [
            ("get", "nodes", "", "", "", "gpu-1"),
            ("patch", "nodes"),
            ("patch", "nodes", "", "", "status"),
            ("list", "pods"),
            ("patch", "pods", "alice"),
            ("get", "configmaps", NS, "", "", "gpushare-node-options"),
            ("create", "events", "alice"),
        ],
        [
            ("list", "nodes"),
            ("delete", "nodes"),
            ("create", "pods", "alice"),
            ("delete", "pods", "alice"),
            ("create", "pods", "alice", "", "binding"),
            ("get", "secrets", NS),
            ("get", "configmaps", NS, "", "", "gpushare-scheduler-config"),
            ("get", "configmaps", "kube-system"),
            ("update", "leases", NS, "coordination.k8s.io"),
        ],
    ),
    "gpushare-scheduler": (
        [
            ("list", "nodes"),
            ("watch", "pods"),
            ("create", "pods", "alice", "", "binding"),
            ("update", "leases", NS, "coordination.k8s.io", "", "gpushare-scheduler"),
            ("get", "configmaps", "kube-system", "", "", "extension-apiserver-authentication"),
        ],
        [
            ("patch", "pods", "alice"),
            ("patch", "nodes"),
            ("get", "secrets", NS),
            ("update", "leases", NS, "coordination.k8s.io", "", "gpushare-extender"),
            ("get", "configmaps", NS, "", "", "gpushare-node-options"),
        ],
    ),
}


# Everything any of the chart's accounts must be able to do.
ALL_MUST = [r for must, _ in RIGHTS.values() for r in must]


@pytest.mark.parametrize("account", sorted(RIGHTS))
def test_each_service_account_has_exactly_its_must_and_none_of_its_must_not(installed: Installed, account):
    user, groups = sa(account)
    must, must_not = RIGHTS[account]
    missing = [r for r in must if not review(installed.api, user, groups, *r)]
    excess = [r for r in must_not if review(installed.api, user, groups, *r)]
    assert (missing, excess) == ([], [])


def test_the_hub_may_read_nodes_and_pods_and_write_only_events_in_its_namespace(installed: Installed):
    user, groups = sa("hub", HUB_NS)
    assert all(review(installed.api, user, groups, v, r) for v, r in [("list", "nodes"), ("watch", "pods")])
    # The service's idle rule writes an Event on a notebook pod for each warning and action.
    assert review(installed.api, user, groups, "create", "events", HUB_NS)
    assert not any(
        review(installed.api, user, groups, *r)
        for r in [
            ("patch", "nodes"),
            ("create", "pods", "alice", "", "binding"),
            ("patch", "pods", "alice"),
            ("create", "events", "alice"),
            ("patch", "events", HUB_NS),
            ("delete", "events", HUB_NS),
        ]
    )


def plugin_api(installed: Installed, node: str) -> client.CoreV1Api:
    """The API as the installed DaemonSet's pod on ``node`` has it: a token bound to that pod."""
    (pod,) = [p for p in installed.pods("device-plugin") if p.spec.node_name == node]
    token = installed.admin.create_namespaced_service_account_token(
        "gpushare-device-plugin",
        NS,
        {
            "spec": {
                "boundObjectRef": {
                    "kind": "Pod",
                    "apiVersion": "v1",
                    "name": pod.metadata.name,
                    "uid": pod.metadata.uid,
                },
                "expirationSeconds": 3600,
            }
        },
    ).status.token
    return installed.cluster.core_api(installed.kubeconfig_with_token(f"plugin-{node}", token))


def test_the_installed_policy_keeps_the_plugin_to_its_own_node(installed: Installed):
    api = plugin_api(installed, "gpu-1")
    answers: list[str] = []
    gpu2 = installed.admin.read_node("gpu-2").metadata.annotations[CARDS_ANNOTATION]

    def refused_elsewhere() -> bool:
        # A real change each try: one let through before the policy was active must not make
        # the next try a no-op, which only the node check would refuse.
        current = (installed.admin.read_node("gpu-2").metadata.annotations or {}).get(CARDS_ANNOTATION)
        patch = {"metadata": {"annotations": {CARDS_ANNOTATION: "[ ]" if current == "[]" else "[]"}}}
        try:
            api.patch_node("gpu-2", patch)
        except ApiException as err:
            answers.append(f"{err.status} {json.loads(err.body)['message']}")
            return err.status == 403
        answers.append("patched")
        return False

    ok = wait_for(refused_elsewhere, timeout=60)
    installed.admin.patch_node("gpu-2", {"metadata": {"annotations": {CARDS_ANNOTATION: gpu2}}})
    assert ok, answers[-3:]
    assert "may not set gpushare-hub.io/cards on node gpu-2" in answers[-1], answers[-1]
    with pytest.raises(ApiException) as err:  # not even a label: the plugin is as narrow as a kubelet
        api.patch_node("gpu-2", {"metadata": {"labels": {"touched": "yes"}}})
    assert err.value.status == 403 and "runs on node gpu-1, not gpu-2" in err.value.body
    original = installed.admin.read_node("gpu-1").metadata.annotations[CARDS_ANNOTATION]
    api.patch_node("gpu-1", {"metadata": {"annotations": {CARDS_ANNOTATION: original}}})


def test_a_users_forged_annotation_is_refused_by_the_installed_policy(installed: Installed):
    installed.cluster.grant(
        "alice", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]}]
    )
    alice = installed.cluster.core_api(installed.cluster.credential("alice", "alice"))
    body = gpu_pod("forged", 5, "nobody-schedules-this")
    body["metadata"]["annotations"] = {GPU_MEM_IDX: "0"}
    messages: list[str] = []

    def refused() -> bool:
        try:
            alice.create_namespaced_pod("alice", body)
        except ApiException as err:
            messages.append(json.loads(err.body)["message"])
            return err.status == 403
        alice.delete_namespaced_pod("forged", "alice", grace_period_seconds=0)
        return False

    assert wait_for(refused, timeout=60), "the installed policy is not enforced"
    assert f"system:serviceaccount:{NS}:gpushare-extender" in messages[-1]
    assert "alice may not set ALIYUN_COM_GPU_MEM_IDX" in messages[-1]


class Pod:
    """Where the chart's scheduler pod would mount things, mapped onto folders of this machine."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, in_pod: str) -> str:
        return str(self.root / in_pod.lstrip("/"))

    def secret(self, mount: str, files: dict[str, Path]) -> None:
        folder = Path(self.path(mount))
        folder.mkdir(parents=True, exist_ok=True)
        for key, source in files.items():
            (folder / key).write_bytes(source.read_bytes())


def sidecar_args(deployment: dict[str, Any], pod: Pod, port: int, metrics: int) -> list[str]:
    """The extender container's rendered args, with this machine's ports and mount folders."""
    (container,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"
    ]
    out = []
    for arg in container["args"]:
        flag, _, value = arg.partition("=")
        if flag == "--port":
            value = str(port)
        elif flag == "--metrics-port":
            value = str(metrics)
        elif flag == "--metrics-ip":
            value = "127.0.0.1"
        elif value.startswith("/etc/"):
            value = pod.path(value)
        out.append(f"{flag}={value}")
    return out


def run_rendered_pair(installed: Installed, docs: list[dict[str, Any]], pod: Pod, leader_elect: bool) -> Any:
    """The extender with the rendered sidecar args as the chart's extender account, then the real
    kube-scheduler with the rendered configuration as the chart's scheduler account.
    Returns the scheduler's process, to stop it."""
    cluster, admin = installed.cluster, installed.admin
    secret = wait_for(
        lambda: (admin.read_namespaced_secret("gpushare-extender-token", NS).data or {}).get("token")
    )
    assert secret, "the token controller did not fill the extender's token Secret"
    ext_kc = installed.kubeconfig_with_token("chart-extender", base64.b64decode(secret).decode())
    port, metrics = free_port(), free_port()
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    extender = Component(
        f"chart-extender-{port}",
        [
            sys.executable,
            "-m",
            "gpushare_hub.extender.app",
            f"--kubeconfig={ext_kc}",
            *sidecar_args(deployment, pod, port, metrics),
        ],
        cluster.logs / f"chart-extender-{port}.log",
    ).start()
    cluster.on_stop(extender.stop)

    def ready() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)

    extender.wait_until(ready, 60, "ready (/readyz)")
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-scheduler-config"
    ]
    rendered = yaml.safe_load(cm["data"]["config.yaml"])
    (entry,) = rendered["extenders"]
    assert entry["urlPrefix"].startswith(
        ("http://127.0.0.1:32766/", "https://127.0.0.1:32766/")
    )  # the sidecar
    entry["urlPrefix"] = entry["urlPrefix"].replace(":32766/", f":{port}/")
    for key in ("certFile", "keyFile", "caFile"):
        if key in entry.get("tlsConfig", {}):
            entry["tlsConfig"][key] = pod.path(entry["tlsConfig"][key])
    token = admin.create_namespaced_service_account_token(
        "gpushare-scheduler", NS, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    (profile,) = rendered["profiles"]
    election = rendered["leaderElection"] if leader_elect else {"leaderElect": False}
    return cluster.start_scheduler(
        profile["schedulerName"],
        extenders=[entry],
        profile=profile,
        extra={
            "clientConnection": {
                "kubeconfig": str(installed.kubeconfig_with_token("chart-scheduler", token))
            },
            "leaderElection": election,
        },
        replica=str(port),
    )


def placed(installed: Installed, name: str, namespace: str) -> Any:
    """The pod once it is bound with our allocation record, else None."""
    pod = installed.admin.read_namespaced_pod(name, namespace)
    ann = pod.metadata.annotations or {}
    return pod if pod.spec.node_name and ALLOCATION_ANNOTATION in ann else None


def place(installed: Installed, name: str) -> Any:
    installed.admin.create_namespaced_pod("alice", gpu_pod(name, 5, "gpushare-scheduler"))
    pod = wait_for(lambda: placed(installed, name, "alice"), timeout=120)
    assert pod, f"{name} not placed; see {installed.cluster.logs}"
    assert pod.spec.node_name in ("gpu-1", "gpu-2")
    return pod


def test_the_installed_scheduler_config_runs_in_kube_scheduler_as_the_charts_accounts_and_places_a_pod(
    installed: Installed, tmp_path: Path
):
    cm = installed.admin.read_namespaced_config_map("gpushare-scheduler-config", NS)
    docs = [d for d in installed.docs if d["kind"] == "Deployment"]
    docs.append({"kind": "ConfigMap", "metadata": {"name": cm.metadata.name}, "data": cm.data})
    scheduler = run_rendered_pair(installed, docs, Pod(tmp_path), leader_elect=True)
    try:
        place(installed, "notebook")
        # docs/install.md, "Try a slice without JupyterHub": the example pod, applied as written.
        installed.run_doc("try-a-slice")
        example = wait_for(lambda: placed(installed, "notebook-alice", "default"), timeout=120)
        assert example and example.spec.node_name in ("gpu-1", "gpu-2"), installed.cluster.logs
        assert GPU_MEM_IDX in example.metadata.annotations
        lease = client.CoordinationV1Api(installed.api).read_namespaced_lease("gpushare-scheduler", NS)
        assert lease.spec.holder_identity  # leader election ran on the chart's Lease, with the chart's Role
    finally:
        scheduler.stop()


def test_the_docs_quota_bounds_the_slices_a_namespace_may_ask_for_itself(installed: Installed):
    """docs/install.md, "Users who create pods themselves": the quota as written, applied to the real
    API server, refuses a pod over it with the quota's words and lets one within it be created."""
    installed.run_doc("user-quota")
    quota = wait_for(
        lambda: installed.admin.read_namespaced_resource_quota("gpu-slices", "team-a").status.hard or None,
        timeout=60,
    )  # the controller manager has counted the namespace: admission can now check pods against it
    assert quota == {"requests.aliyun.com/gpu-mem": "7", "requests.aliyun.com/gpu-count": "0"}
    try:
        greedy = gpu_pod("greedy", 8, scheduler="gpushare-scheduler")
        with pytest.raises(ApiException) as refused:
            installed.admin.create_namespaced_pod("team-a", greedy)
        assert refused.value.status == 403
        assert "exceeded quota: gpu-slices" in refused.value.body, refused.value.body
        assert "requests.aliyun.com/gpu-mem=8" in refused.value.body
        installed.admin.create_namespaced_pod("team-a", gpu_pod("modest", 5, scheduler="gpushare-scheduler"))
    finally:
        installed.admin.delete_namespace("team-a")


def test_with_mutual_tls_the_rendered_scheduler_and_sidecar_agree_on_one_secret(
    installed: Installed, helm: Helm, tmp_path: Path
):
    """The chart's TLS Secret layout, mounted where each container expects it, as kube-scheduler uses it."""
    ca = PKI(tmp_path / "secret")
    serving = ca.issue("tls", "gpushare-extender", server=True, hosts=("localhost",))
    caller = ca.issue("client", "gpushare-scheduler")
    secret = {
        "ca.crt": ca.ca,
        "tls.crt": serving.cert,
        "tls.key": serving.key,
        "client.crt": caller.cert,
        "client.key": caller.key,
    }
    docs = helm.template(
        *INSTALL_VALUES,
        "--set=extender.tls.enabled=true",
        "--set=extender.tls.existingSecret=ext-tls",
        namespace=NS,
        release=RELEASE,
    )
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    pod = Pod(tmp_path / "pod")
    for container in deployment["spec"]["template"]["spec"]["containers"]:
        for mount in container["volumeMounts"]:
            if mount["name"] == "tls":
                pod.secret(mount["mountPath"], secret)
    scheduler = run_rendered_pair(installed, docs, pod, leader_elect=False)
    try:
        place(installed, "notebook-tls")
    finally:
        scheduler.stop()


def test_uninstall_leaves_nothing_of_ours(installed: Installed):
    """Runs last in this module: docs/uninstall.md, then every object the chart rendered, and their
    pods, are gone, and so are the labels and annotations the docs remove from the nodes."""
    installed.run_doc("uninstall")
    installed.uninstalled = True
    dyn = dynamic.DynamicClient(installed.api)

    def left() -> list[str]:
        out = []
        for doc in installed.docs:
            resource = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
            namespace = doc["metadata"].get("namespace") if resource.namespaced else None
            try:
                resource.get(name=doc["metadata"]["name"], namespace=namespace)
                out.append(f"{doc['kind']}/{doc['metadata']['name']}")
            except ApiException as err:
                if err.status != 404:
                    raise
        pods = installed.admin.list_namespaced_pod(NS, label_selector=f"app.kubernetes.io/instance={RELEASE}")
        out += [f"Pod/{p.metadata.name}" for p in pods.items]
        return out

    assert wait_for(lambda: not left(), timeout=120), left()
    # What kube-scheduler itself made stays, as with any scheduler, until the namespace goes
    # (the docs delete it): its Lease in the release namespace.
    leases = client.CoordinationV1Api(installed.api).list_namespaced_lease(NS).items
    assert [x.metadata.name for x in leases] in ([], ["gpushare-scheduler"])
    for node in ("gpu-1", "gpu-2"):
        meta = installed.admin.read_node(node).metadata
        assert not {"gpushare", MPS_LABEL, MPS_MULTI_USER_LABEL} & set(meta.labels or {})
        assert CARDS_ANNOTATION not in (meta.annotations or {})
