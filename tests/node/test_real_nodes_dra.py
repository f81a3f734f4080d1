"""The DRA path on a real node (runs after test_real_nodes.py, on the node it left clean).

Our chart with ``dra.enabled`` on the newest pinned Kubernetes (consumable capacity on by default),
the node labelled for DRA, and Zero to JupyterHub 4.4.0 with examples/z2jh-dra-values.yaml: the
DRA kubelet plugin registers with the real kubelet and publishes the node's ResourceSlice; two
users' 5 GiB notebooks claim their slices from the chart's templates and are placed by the default
kube-scheduler on one card, with no extender in the path; the kubelet asks our plugin to prepare
them and containerd 2 applies the per-claim CDI devices. Then: the dashboard's ledger and `kubectl
inspect gpushare` agree with the claims; a spawn that fits no card waits, and its progress says so
in a user's words; a kubelet restart and a plugin restart lose nothing; `helm uninstall` leaves no
slice, class, template, CDI file or socket.
"""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare_hub.core.names import DRA_DEVICE_CLASS, DRA_DRIVER, DRA_POD_CLAIM, DRA_TEMPLATE_PREFIX
from gpushare_hub.localcluster.processes import HarnessError
from gpushare_hub.localcluster.realstack import (
    GPUSHARE_NAMESPACE,
    HUB_NAMESPACE,
    SIMULATED_CARDS,
    RealStack,
    default_z2jh_chart,
    images_module,
)
from tests.conftest import wait_for
from tests.doccommands import ROOT
from tests.node.conftest import Hub
from tests.support.realnode import (
    exec_in,
    inspect_env,
    kubectl,
    notebook_pod,
    pods,
    ready,
    restarts,
    spawn,
    wait_ready,
)

RESOURCE = "/apis/resource.k8s.io/v1"
USERS = ("alice", "bob")
PLUGIN = "app.kubernetes.io/component=dra-plugin"
LABEL = "gpushare-hub.io/dra"


@pytest.fixture(scope="module")
def node(stack: RealStack) -> Any:
    """The first node, served by the DRA plugin of our chart in DRA mode."""
    first = next(iter(stack.nodes.nodes))
    kubectl(stack, "label", "node", first, f"{LABEL}=true", "gpushare=true", "--overwrite")
    kubectl(stack, "create", "namespace", HUB_NAMESPACE)
    version = images_module().package_version()
    stack.run(
        "helm", "install", "gpushare-hub", stack.chart, "--version", version, "--plain-http",
        "--namespace", GPUSHARE_NAMESPACE, "--create-namespace",
        "--set", f"hub.serviceAccount.namespace={HUB_NAMESPACE}", "--set", "dra.enabled=true",
        "--set", f"dra.namespace={HUB_NAMESPACE}",
        "--set", "devicePlugin.runtimeClassName=nvidia",
        "--set", "devicePlugin.driverRoot=/run/nvidia/driver",
        "--set-string", f"devicePlugin.simulate={SIMULATED_CARDS}", "--wait", "--timeout=8m",
    )  # fmt: skip
    yield first


@pytest.fixture(scope="module")
def hub(stack: RealStack, node: str) -> Iterator[Hub]:
    """Zero to JupyterHub as docs/zero-to-jupyterhub.md installs it, with the DRA path's values.
    The hub database's volume of an earlier install (kept on uninstall, Released) is made again."""
    kubectl(stack, "delete", "persistentvolume", "jupyterhub-hub-db", "--ignore-not-found", "--wait=true")
    stack.install_z2jh(default_z2jh_chart(), extra_values=("examples/z2jh-dra-values.yaml",))
    yield Hub(stack.hub_url, stack.admin_token)


def plugin_pod(stack: RealStack) -> dict[str, Any] | None:
    found = [p for p in pods(stack, GPUSHARE_NAMESPACE, PLUGIN) if not p["metadata"].get("deletionTimestamp")]
    return found[0] if len(found) == 1 and ready(found[0]) else None


def plugin_log(stack: RealStack) -> str:
    pod = plugin_pod(stack)
    try:
        return (
            kubectl(stack, "logs", f"--namespace={GPUSHARE_NAMESPACE}", pod["metadata"]["name"])
            if pod
            else ""
        )
    except HarnessError:
        return ""


def our_slice(stack: RealStack, node: str) -> dict[str, Any] | None:
    items = stack.cluster.get_json(f"{RESOURCE}/resourceslices")["items"]
    found = [s for s in items if s["spec"]["driver"] == DRA_DRIVER and s["spec"].get("nodeName") == node]
    return found[0] if found else None


def slice_pod(stack: RealStack, name: str, slug: str) -> dict[str, Any]:
    """A pod of the hub's namespace with a claim from the chart's template of ``slug``, placed by the
    default scheduler: python3 sleeping in the notebook image."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "resourceClaims": [
                {"name": DRA_POD_CLAIM, "resourceClaimTemplateName": DRA_TEMPLATE_PREFIX + slug}
            ],
            "containers": [{
                "name": "notebook", "image": stack.names["singleuser"], "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-c", "import time; time.sleep(3600)"],
                "resources": {"claims": [{"name": DRA_POD_CLAIM}]},
            }],
        },
    }  # fmt: skip
    path = stack.cluster.workdir / f"{name}.json"
    path.write_text(json.dumps(body))
    kubectl(stack, "apply", f"--namespace={HUB_NAMESPACE}", f"--filename={path}")
    return body


def pod(stack: RealStack, name: str) -> dict[str, Any]:
    return dict(stack.cluster.get_json(f"/api/v1/namespaces/{HUB_NAMESPACE}/pods/{name}"))


def claim_of(stack: RealStack, name: str) -> dict[str, Any]:
    (status,) = pod(stack, name)["status"]["resourceClaimStatuses"]
    return dict(
        stack.cluster.get_json(
            f"{RESOURCE}/namespaces/{HUB_NAMESPACE}/resourceclaims/{status['resourceClaimName']}"
        )
    )


def device_of(stack: RealStack, name: str) -> tuple[str, str, str]:
    (result,) = claim_of(stack, name)["status"]["allocation"]["devices"]["results"]
    return result["pool"], result["device"], result["consumedCapacity"]["memory"]


def card_uuid(stack: RealStack, node: str, index: int) -> str:
    annotations = stack.cluster.get_json(f"/api/v1/nodes/{node}")["metadata"]["annotations"]
    return str(
        next(c["uuid"] for c in json.loads(annotations["gpushare-hub.io/cards"]) if c["index"] == index)
    )


def env_of(stack: RealStack, name: str) -> dict[str, str]:
    out = exec_in(
        stack, HUB_NAMESPACE, name, "python3", "-c", "import json, os; print(json.dumps(dict(os.environ)))"
    )
    return dict(json.loads(out))


def wait_running(stack: RealStack, *names: str) -> None:
    for name in names:
        assert wait_for(lambda n=name: ready(pod(stack, n)), 180, every=1), (
            pod(stack, name)["status"],
            plugin_log(stack),
        )


def test_the_dra_plugin_publishes_the_nodes_cards(stack: RealStack, node: str) -> None:
    assert wait_for(lambda: plugin_pod(stack), 120, every=1), pods(stack, GPUSHARE_NAMESPACE, PLUGIN)
    assert [p["spec"]["nodeName"] for p in pods(stack, GPUSHARE_NAMESPACE, PLUGIN)] == [node]
    # One path per node: the device plugin keeps off a DRA node.
    assert pods(stack, GPUSHARE_NAMESPACE, "app.kubernetes.io/component=device-plugin") == []
    published = wait_for(lambda: our_slice(stack, node), 60, every=1)
    assert published, plugin_log(stack)
    devices = published["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"]
    assert all(d["allowMultipleAllocations"] and d["capacity"]["memory"]["value"] == "15Gi" for d in devices)
    cards = json.loads(
        stack.cluster.get_json(f"/api/v1/nodes/{node}")["metadata"]["annotations"]["gpushare-hub.io/cards"]
    )
    assert [d["attributes"]["uuid"]["string"] for d in devices] == [c["uuid"] for c in cards]
    assert stack.cluster.get_json(f"{RESOURCE}/deviceclasses/{DRA_DEVICE_CLASS}")
    templates = stack.cluster.get_json(f"{RESOURCE}/namespaces/{HUB_NAMESPACE}/resourceclaimtemplates")[
        "items"
    ]
    assert {t["metadata"]["name"] for t in templates} == {f"{DRA_TEMPLATE_PREFIX}t4-{n}g" for n in (3, 5, 7)}


def test_two_users_5_gib_claims_share_one_card_by_the_default_scheduler(
    stack: RealStack, node: str, hub: Hub
) -> None:
    for user in USERS:
        spawn(hub, user, "t4-5g")
    for user in USERS:
        wait_ready(hub, user, stack)
    names = [f"jupyter-{u}" for u in USERS]
    assert device_of(stack, names[0]) == device_of(stack, names[1]) == (node, "gpu-0", "5Gi")
    assert {notebook_pod(stack, u)["spec"].get("schedulerName") for u in USERS} == {"default-scheduler"}
    assert all("aliyun.com/gpu-mem" not in json.dumps(notebook_pod(stack, u)["spec"]) for u in USERS)
    card0 = card_uuid(stack, node, 0)
    for name in names:
        env = env_of(stack, name)
        assert env["GPUSHARE_CARD_UUIDS"] == card0 and env["GPUSHARE_MEMORY_LIMIT_MIB"] == "5120", env
        assert env["PYTHONPATH"].startswith("/opt/gpushare-hub/pyhook")
        listing = exec_in(
            stack, HUB_NAMESPACE, name, "python3", "-c", "import os; print(*os.listdir('/dev'))"
        )
        assert {d for d in listing.split() if d.startswith("nvidia") and d[6:].isdigit()} == {"nvidia0"}, (
            listing
        )
        uid = claim_of(stack, name)["metadata"]["uid"]
        assert stack.nodes.host_path(node, f"/var/run/cdi/gpushare-hub.io-claim_{uid}.json").exists()
    # The admin's views agree with the claims: kubectl inspect gpushare and the dashboard's ledger.
    report = json.loads(subprocess.run(
        ["kubectl-inspect-gpushare", "--json"], env=inspect_env(stack), cwd=ROOT, capture_output=True,
        text=True, timeout=60, check=True,
    ).stdout)  # fmt: skip
    (row,) = [n for n in report["nodes"] if n["name"] == node]
    card = next(c for c in row["cards"] if c["index"] == 0)
    assert {(p["name"], p["units"]) for p in card["pods"]} == {(n, 5) for n in names}, card

    def holdings() -> set[tuple[str, str, int]]:
        status, ledger = hub.call("GET", "/services/gpushare/api/v1/ledger")
        assert status == 200, ledger
        return {(a["hub_user"], a["card_uuid"], a["units"]) for a in ledger["allocations"]}

    want = {(u, card0, 5) for u in USERS}
    assert wait_for(lambda: holdings() == want, 60, every=2), holdings()


def progress(hub: Hub, user: str, until: str, timeout: float = 120) -> list[str]:
    """The spawn page's messages for ``user``'s pending spawn, read until one contains ``until``."""
    messages: list[str] = []
    req = urllib.request.Request(
        f"{hub.url}/hub/api/users/{user}/server/progress", headers={"Authorization": f"token {hub.token}"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data:"):
                messages.append(str(json.loads(line[5:]).get("message", "")))
                if until in messages[-1]:
                    break
    return messages


def test_a_spawn_that_fits_no_card_waits_and_says_why(stack: RealStack, node: str, hub: Hub) -> None:
    for name in ("cy", "di"):
        slice_pod(stack, name, "t4-7g")
    wait_running(stack, "cy", "di")
    assert device_of(stack, "cy")[1] == device_of(stack, "di")[1] == "gpu-1"  # 5 + 5 on gpu-0: 7 fits gpu-1
    # 5 GiB left on gpu-0, 1 GiB on gpu-1: carol's 7 GiB fits no card.
    started = threading.Thread(target=spawn, args=(hub, "carol", "t4-7g"))
    started.start()
    try:
        assert wait_for(lambda: hub.call("GET", "/hub/api/users/carol")[1].get("pending") == "spawn", 60)
        said = progress(hub, "carol", "No card has 7 GiB free")
        # The scheduler's words about claims, as the spawner puts them for the user.
        assert any("No card has 7 GiB free right now" in m and "waits" in m for m in said), said
    finally:
        started.join(timeout=60)
        hub.call("DELETE", "/hub/api/users/carol/server")
    assert wait_for(lambda: not pods(stack, HUB_NAMESPACE, "hub.jupyter.org/username=carol"), 120, every=1)


def test_a_kubelet_restart_and_a_plugin_restart_lose_nothing(stack: RealStack, node: str, hub: Hub) -> None:
    before = our_slice(stack, node)
    assert before
    stack.nodes.restart_kubelet(node)  # it deletes the node's slices at its start; the plugin registers again

    def republished() -> dict[str, Any] | None:
        now = our_slice(stack, node)
        return now if now and now["metadata"]["uid"] != before["metadata"]["uid"] else None

    assert wait_for(republished, 120, every=1), plugin_log(stack)
    old = plugin_pod(stack)
    assert old
    kubectl(
        stack, "delete", "pod", f"--namespace={GPUSHARE_NAMESPACE}", old["metadata"]["name"], "--wait=true"
    )
    assert wait_for(
        lambda: (p := plugin_pod(stack)) and p["metadata"]["uid"] != old["metadata"]["uid"], 120, every=1
    )
    assert wait_for(lambda: "4 prepared claim(s) read" in plugin_log(stack), 60, every=1), plugin_log(stack)
    for name in ("jupyter-alice", "jupyter-bob", "cy", "di"):
        p = pod(stack, name)
        assert ready(p) and restarts(p) == 0, p["status"]
        assert env_of(stack, name)["GPUSHARE_MEMORY_LIMIT_MIB"] in ("5120", "7168")
    # The restarted plugin unprepares what the one before it prepared, and prepares anew.
    uid = claim_of(stack, "jupyter-bob")["metadata"]["uid"]
    hub.call("DELETE", "/hub/api/users/bob/server")
    spec = stack.nodes.host_path(node, f"/var/run/cdi/gpushare-hub.io-claim_{uid}.json")
    assert wait_for(lambda: not spec.exists(), 60, every=1)
    slice_pod(stack, "fay", "t4-3g")
    wait_running(stack, "fay")
    assert device_of(stack, "fay") == (node, "gpu-0", "3Gi")  # gpu-0 holds 5 GiB and is the first to fit


def test_uninstall_leaves_no_slice_class_template_cdi_file_or_socket(stack: RealStack, node: str) -> None:
    kubectl(stack, "delete", "pods", f"--namespace={HUB_NAMESPACE}", "--all", "--wait=true")
    # As docs/uninstall.md says: foreground, so that the command returns once the plugin's pod is
    # gone, that is once the plugin has cleaned its node. With helm's default (background) it
    # returned while the plugin was still leaving, and a check right after could find the hook's
    # folder half emptied (sitecustomize.py still there, the ledger module gone) on a loaded machine.
    stack.run(
        "helm", "uninstall", "gpushare-hub", "--namespace", GPUSHARE_NAMESPACE, "--wait",
        "--cascade", "foreground", "--timeout=4m",
    )  # fmt: skip
    assert pods(stack, GPUSHARE_NAMESPACE, PLUGIN) == [], "helm uninstall returned before the plugin left"
    assert our_slice(stack, node) is None, our_slice(stack, node)
    classes = stack.cluster.get_json(f"{RESOURCE}/deviceclasses")["items"]
    assert DRA_DEVICE_CLASS not in {c["metadata"]["name"] for c in classes}
    assert (
        stack.cluster.get_json(f"{RESOURCE}/namespaces/{HUB_NAMESPACE}/resourceclaimtemplates")["items"] == []
    )
    left = [
        *stack.nodes.host_path(node, "/var/run/cdi").glob("gpushare-hub.io*"),
        *stack.nodes.host_path(node, "/var/lib/kubelet/plugins_registry").glob(f"{DRA_DRIVER}*"),
        *[p for p in stack.nodes.host_path(node, f"/var/lib/kubelet/plugins/{DRA_DRIVER}").glob("*")],
        *[f for f in stack.nodes.host_path(node, "/var/lib/gpushare-hub").rglob("*") if not f.is_dir()],
    ]
    assert left == [], left
    kubectl(stack, "label", "node", node, f"{LABEL}-", "gpushare-")
    kubectl(stack, "delete", "namespace", HUB_NAMESPACE, "--wait=true")
