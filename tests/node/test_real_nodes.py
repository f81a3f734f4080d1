"""The chart and Zero to JupyterHub on a real node, in the order an admin meets them.

1. ``helm install`` of our chart (simulated cards): the scheduler replicas with their extender,
   probes passing, one leader; the device plugin registered with the real kubelet, in CDI mode on
   containerd 2 (its spec in the node's /var/run/cdi) beside the NVIDIA toolkit's runtime.
2. Zero to JupyterHub 4.4.0 with examples/z2jh-values.yaml and z2jh-small-cluster-values.yaml.
3. Two users' 5 GiB notebooks share one card; what the kubelet and containerd's CDI delivered
   inside the containers (their card's device node, no other); pods without a slice see no card;
   a whole-card pod and an Aliyun-style pod see exactly their cards. A second node joins set up
   the legacy way (``nvidia`` the default runtime, NVIDIA's prestart hook): its pods see their
   cards through ``NVIDIA_VISIBLE_DEVICES``.
4. ``helm upgrade`` to a new image tag and a kubelet restart, with both notebooks running.
5. ``helm uninstall`` of both charts as docs/uninstall.md says: nothing of ours left on either node.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpushare_hub.core.records import Allocation, read_allocation
from gpushare_hub.localcluster.processes import HarnessError
from gpushare_hub.localcluster.realstack import (
    GPUSHARE_NAMESPACE,
    HUB_NAMESPACE,
    RealStack,
    default_z2jh_chart,
)
from gpushare_hub.plugin.response import HOOK_CONTAINER_PATH
from tests.conftest import wait_for
from tests.doccommands import ROOT, doc_block, substitute
from tests.node.conftest import Hub
from tests.objects import read_pod
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

USERS = ("alice", "bob")
SLICE = "t4-5g"


def card_of(pod: dict[str, Any]) -> str:
    alloc = read_allocation(read_pod(pod))
    assert isinstance(alloc, Allocation), (pod["metadata"].get("annotations"), alloc)
    (share,) = alloc.cards
    return str(share.uuid)


@pytest.fixture(scope="module")
def hub(stack: RealStack) -> Hub:
    if not stack.hub_url:
        pytest.skip("Zero to JupyterHub did not install (see test_zero_to_jupyterhub_runs_our_hub)")
    return Hub(stack.hub_url, stack.admin_token)


# ---- 1. our chart --------------------------------------------------------------------------
def test_chart_installs_and_runs_on_the_real_node(stack: RealStack) -> None:
    node = next(iter(stack.nodes.nodes))
    readme = doc_block("readme-install", "node-tier").commands()
    assert len(readme) <= 6, "README.md: at most six commands from an empty cluster to shared cards"
    assert {argv[0] for argv in readme} == {"kubectl", "helm"}, "only kubectl and helm: no file to edit"
    label, namespace, install = (substitute(argv, {"<gpu-node>": node}) for argv in readme[:3])
    published = "oci://ghcr.io/gpushare-hub/charts/gpushare-hub"
    assert install[3] == published, install
    install[3] = stack.chart  # the same path in the cluster's own registry
    (simulate,) = [
        a
        for a in doc_block("install-simulated", "node-tier").commands()[-1]
        if a.startswith("devicePlugin.simulate=")
    ]
    local = ["--plain-http", "--set-string", simulate]
    assert stack.gpushare_install_argvs() == [label, namespace, install + local], (
        "the harness installs the chart otherwise than README.md says"
    )
    operator = [substitute(argv, {"<gpu-node-1>": node, "<gpu-node-2>": node}) for argv in
                doc_block("gpu-operator-install", "node-tier").commands()]  # fmt: skip
    assert operator[1:] == [substitute(argv, {"<gpu-node>": node}) for argv in readme[1:3]], (
        "docs/gpu-operator.md and README.md install the chart differently"
    )
    stack.install_gpushare()

    scheduler = pods(stack, GPUSHARE_NAMESPACE, "app.kubernetes.io/component=scheduler")
    assert len(scheduler) == 2 and all(ready(p) for p in scheduler), scheduler
    for pod in scheduler:
        names = {c["name"] for c in pod["spec"]["containers"]}
        assert names == {"kube-scheduler", "extender"}, names
        assert pod["spec"]["nodeName"] == node
        for c in pod["spec"]["containers"]:  # Ready: the readiness probes pass; no restart: liveness
            assert c.get("readinessProbe") or c.get("livenessProbe"), c["name"]
        assert restarts(pod) == 0, pod["status"]

    def holders() -> list[str]:  # a replica may be Ready before it has taken the Lease
        leases = stack.cluster.get_json(
            f"/apis/coordination.k8s.io/v1/namespaces/{GPUSHARE_NAMESPACE}/leases"
        )
        return [
            item["spec"].get("holderIdentity", "")
            for item in leases["items"]
            if item["metadata"]["name"] == "gpushare-scheduler" and item["spec"].get("holderIdentity")
        ]

    # The node's containerd pulled our images from the registry (their repo digest is the one the
    # registry serves), as a lab's node pulls them from ghcr.io: nothing was imported.
    for pod in [*scheduler, *pods(stack, GPUSHARE_NAMESPACE, "app.kubernetes.io/component=device-plugin")]:
        for status in pod["status"]["containerStatuses"]:
            name, tag = status["image"].rsplit(":", 1)
            digest = stack.registry.digest(name.split("/", 1)[1], tag)
            assert status["imageID"] == f"{name}@{digest}", status

    holders_now = wait_for(holders, 60)
    assert len(holders_now) == 1, holders_now
    assert any(holders_now[0].startswith(p["metadata"]["name"]) for p in scheduler), holders_now

    plugin_selector = "app.kubernetes.io/component=device-plugin"
    assert wait_for(
        lambda: [ready(p) for p in pods(stack, GPUSHARE_NAMESPACE, plugin_selector)] == [True], 60
    )
    assert [p["spec"]["nodeName"] for p in pods(stack, GPUSHARE_NAMESPACE, plugin_selector)] == [node]
    allocatable = wait_for(
        lambda: stack.cluster.get_json(f"/api/v1/nodes/{node}")["status"]["allocatable"].get(
            "aliyun.com/gpu-mem"
        ),
        60,
    )
    assert allocatable == "30", "two simulated T4s are 15 GiB slices each"
    # containerd 2 applies CDI devices: the plugin chose CDI mode and wrote its spec on the node.
    annotations = stack.cluster.get_json(f"/api/v1/nodes/{node}")["metadata"]["annotations"]
    assert annotations.get("gpushare-hub.io/device-mode") == "cdi", _plugin_log(stack)[-20:]
    spec = json.loads(stack.nodes.host_path(node, "/var/run/cdi/gpushare-hub.io-gpu.json").read_text())
    cards = json.loads(annotations["gpushare-hub.io/cards"])
    assert spec["kind"] == "gpushare-hub.io/gpu"
    assert {d["name"]: d["containerEdits"]["deviceNodes"][0]["path"] for d in spec["devices"]} == {
        c["uuid"]: f"/dev/nvidia{c['index']}" for c in cards
    }
    # The MPS control daemons need a GPU; their DaemonSet is rendered and admitted here.
    rendered = stack.run(
        "helm", "template", "gpushare-hub", "helm/gpushare-hub", f"--namespace={GPUSHARE_NAMESPACE}",
        "--set=mps.enabled=true", "--set=mps.shmSize=1g", "--set=mps.maxSliceMemory=7G",
        "--show-only=templates/mps-control-daemon.yaml",
        f"--kube-version={stack.cluster.version()['gitVersion']}",
    )  # fmt: skip
    path = stack.cluster.workdir / "mps.yaml"
    path.write_text(rendered)
    out = kubectl(stack, "apply", "--dry-run=server", f"--filename={path}")
    assert "daemonset.apps/gpushare-mps-control-daemon" in out, out


# ---- 2. Zero to JupyterHub -----------------------------------------------------------------
def test_zero_to_jupyterhub_runs_our_hub(stack: RealStack) -> None:
    (documented,) = doc_block("z2jh-small-cluster", "node-tier").commands()
    assert stack.z2jh_install_argv("jupyterhub/jupyterhub") == documented, (
        "the harness installs Zero to JupyterHub otherwise than docs/zero-to-jupyterhub.md says"
    )
    # README.md's: the chart from Zero to JupyterHub's repository, our values from the release's tag;
    # here the chart unpacked and the values of this checkout, with the small cluster's beside them.
    readme = doc_block("readme-install", "node-tier").commands()[-1]
    repo = readme.index("--repo")
    values = readme.index("--values") + 1
    assert readme[values].endswith("/examples/z2jh-values.yaml"), readme
    readme[values] = "examples/z2jh-values.yaml"
    readme[repo - 1 : repo + 2] = ["jupyterhub/jupyterhub"]
    readme[readme.index("--namespace") + 2 : readme.index("--namespace") + 2] = ["--create-namespace"]
    assert [*readme, "--values", "examples/z2jh-small-cluster-values.yaml"] == documented, readme
    stack.install_z2jh(default_z2jh_chart())
    (hub_pod,) = pods(stack, HUB_NAMESPACE, "component=hub")
    assert ready(hub_pod)
    assert hub_pod["spec"]["containers"][0]["image"] == stack.names["hub"]
    (proxy_pod,) = pods(stack, HUB_NAMESPACE, "component=proxy")
    assert ready(proxy_pod)
    status, info = Hub(stack.hub_url, stack.admin_token).call("GET", "/hub/api/")
    assert status == 200 and "version" in info, info


# ---- 3. two users, one card ----------------------------------------------------------------


def test_two_users_share_one_card_in_real_containers(stack: RealStack, hub: Hub) -> None:
    for user in USERS:
        spawn(hub, user, SLICE)
    started = time.monotonic()
    for user in USERS:
        wait_ready(hub, user, stack)
    print(f"two 5 GiB notebooks ready on the real node in {time.monotonic() - started:.1f} s")
    pod_a, pod_b = (notebook_pod(stack, u) for u in USERS)
    assert pod_a["spec"]["nodeName"] == pod_b["spec"]["nodeName"] == next(iter(stack.nodes.nodes))
    assert card_of(pod_a) == card_of(pod_b), "binpack puts both 5 GiB slices on the one card"
    for user, pod in zip(USERS, (pod_a, pod_b), strict=True):
        name = pod["metadata"]["name"]
        env = dict(
            line.split("=", 1)
            for line in exec_in(stack, HUB_NAMESPACE, name, "env").splitlines()
            if "=" in line
        )
        # CDI mode: the card by UUID in our variable, "void" for the NVIDIA runtime, and in /dev
        # exactly that card's device node (with the control nodes), as containerd applied the spec.
        assert env["GPUSHARE_CARD_UUIDS"] == card_of(pod), (user, env.get("GPUSHARE_CARD_UUIDS"))
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void", env.get("NVIDIA_VISIBLE_DEVICES")
        assert nvidia_devices(stack, name) == {f"nvidia{index_of(stack, pod)}", *CONTROL_NODES}
        assert HOOK_CONTAINER_PATH in env.get("PYTHONPATH", "").split(":"), env.get("PYTHONPATH")
        assert_hook_mounted_read_only(stack, HUB_NAMESPACE, name)
        terminal = terminal_env(stack, hub, user)
        assert terminal.get("GPUSHARE_CARD_UUIDS") == card_of(pod), terminal
        assert HOOK_CONTAINER_PATH in terminal.get("PYTHONPATH", "").split(":"), terminal

    status, ledger = hub.call("GET", "/services/gpushare/api/v1/ledger")
    assert status == 200, ledger
    node = pod_a["spec"]["nodeName"]
    assert _holdings(ledger) == {(node, f"jupyter-{user}", user, card_of(pod_a), 5) for user in USERS}, (
        ledger["allocations"]
    )
    inspect = subprocess.run(
        [str(Path(stack.kubectl).parent / "kubectl"), "inspect", "gpushare"],
        capture_output=True,
        text=True,
        env=inspect_env(stack),
        timeout=60,
    )
    assert inspect.returncode == 0, inspect.stderr
    assert "10/15" in inspect.stdout, inspect.stdout


CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


def nvidia_devices(stack: RealStack, pod: str, namespace: str = HUB_NAMESPACE) -> set[str]:
    """The NVIDIA device nodes a container has in its /dev."""
    listing = exec_in(stack, namespace, pod, "python3", "-c", "import os; print(*os.listdir('/dev'))")
    return {n for n in listing.split() if n.startswith("nvidia")}


def index_of(stack: RealStack, pod: dict[str, Any]) -> int:
    node = stack.cluster.get_json(f"/api/v1/nodes/{pod['spec']['nodeName']}")
    cards = json.loads(node["metadata"]["annotations"]["gpushare-hub.io/cards"])
    return int(next(c["index"] for c in cards if c["uuid"] == card_of(pod)))


def plain_pod(stack: RealStack, name: str, limits: dict[str, str], **spec: Any) -> dict[str, Any]:
    """A pod from a plain manifest (no hub): python3 sleeping, with these limits."""
    container = {
        "name": "c", "image": stack.names["singleuser"], "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", "import time; time.sleep(3600)"], "resources": {"limits": limits},
    }  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], **spec},
    }


def test_pods_see_exactly_the_cards_they_asked_for(stack: RealStack, hub: Hub) -> None:
    """Beside the two notebooks (one card, 10 of 15 GiB): a pod without a slice, one run by the
    NVIDIA runtime class, an Aliyun-style 3 GiB pod and a whole-card pod, each seeing only its own."""
    names = ("no-slice", "nvidia-runtime", "aliyun-style", "whole-card")
    sched = {"schedulerName": "gpushare-scheduler"}
    manifests = [
        plain_pod(stack, "no-slice", {}),
        # The toolkit's runtime, as the GPU Operator sets it up (CDI mode, not the default):
        # a pod that asks for no card goes through it unchanged.
        plain_pod(stack, "nvidia-runtime", {}, runtimeClassName="nvidia"),
        plain_pod(stack, "aliyun-style", {"aliyun.com/gpu-mem": "3"}, **sched),
        plain_pod(stack, "whole-card", {"aliyun.com/gpu-count": "1"}, **sched),
    ]
    try:
        apply_ready(stack, manifests)
        assert nvidia_devices(stack, "no-slice", "default") == set()
        assert nvidia_devices(stack, "nvidia-runtime", "default") == set()
        aliyun, whole = _pod(stack, "aliyun-style"), _pod(stack, "whole-card")
        assert card_of(aliyun) == card_of(notebook_pod(stack, USERS[0])), "binpack: 10 + 3 of 15 GiB"
        assert card_of(whole) != card_of(aliyun), "the whole card is the other one"
        for pod in (aliyun, whole):
            name = pod["metadata"]["name"]
            assert nvidia_devices(stack, name, "default") == {f"nvidia{index_of(stack, pod)}", *CONTROL_NODES}
            uuids = exec_in(stack, "default", name, "printenv", "GPUSHARE_CARD_UUIDS").strip()
            assert uuids == card_of(pod), uuids
    finally:
        delete_pods(stack, names)


def test_a_user_cannot_take_the_cards_through_the_runtimes_environment(stack: RealStack) -> None:
    """A pod with ``NVIDIA_VISIBLE_DEVICES=all`` in the NVIDIA runtime class asks for no GPU, yet the
    toolkit's runtime (as the GPU Operator sets it up) hands it every card of the node, which no
    ledger, quota or budget counts. An admin's pod, which the policy lets through as it would any
    pod with the policy off, shows that the hole is real; a user's (alice may edit the namespace)
    is refused at admission, naming the variable."""
    node = next(iter(stack.nodes.nodes))
    body = plain_pod(stack, "all-cards", {}, runtimeClassName="nvidia", nodeName=node)
    body["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    path = stack.cluster.workdir / "all-cards.json"
    path.write_text(json.dumps(body))
    kubectl(stack, "create", "rolebinding", "alice-edits", "--clusterrole=edit", "--user=alice",
            "--namespace=default")  # fmt: skip
    try:
        refused = subprocess.run(
            [str(stack.kubectl), "create", "--as=alice", "--namespace=default", f"--filename={path}"],
            env=inspect_env(stack), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert refused.returncode != 0, "alice's pod was admitted"
        assert "container c sets NVIDIA_VISIBLE_DEVICES" in refused.stderr, refused.stderr
        assert _pod_or_none(stack, "all-cards") is None
        apply_ready(stack, [body])
        assert {"nvidia0", "nvidia1"} <= nvidia_devices(stack, "all-cards", "default")
    finally:
        delete_pods(stack, ["all-cards"])
        kubectl(stack, "delete", "rolebinding", "alice-edits", "--namespace=default", "--ignore-not-found")


def _pod_or_none(stack: RealStack, name: str) -> dict[str, Any] | None:
    found = [p for p in pods(stack, "default") if p["metadata"]["name"] == name]
    return found[0] if found else None


def test_a_legacy_runtime_node_hands_out_cards_through_nvidia_visible_devices(stack: RealStack) -> None:
    """A second node set up as before GPU Operator v25.10 (or with its CDI off): ``nvidia`` is
    containerd's default runtime, in the toolkit's legacy mode, and the admin sets ``deviceMode:
    legacy`` for it. Our plugin says so on the Node; Allocate's ``NVIDIA_VISIBLE_DEVICES=<UUID>``
    reaches NVIDIA's prestart hook (built from the toolkit's module), whose device list the
    nvidia-container-cli stand-in (gpushare_hub/localcluster/fakecli.py) turns into device nodes.
    Each pod sees exactly its card; the node stays for the rest of the tier."""
    name = f"legacy-{len(stack.nodes.nodes)}"
    options = json.dumps({name: {"deviceMode": "legacy"}})
    stack.run(
        "helm", "upgrade", "gpushare-hub", "helm/gpushare-hub", f"--namespace={GPUSHARE_NAMESPACE}",
        "--reuse-values", f"--set-json=devicePlugin.nodeOptions={options}", "--wait", "--timeout=5m",
    )  # fmt: skip
    assert stack.nodes.add(1, prefix="legacy-", legacy=True) == [name]

    def published() -> dict[str, str]:
        node = stack.cluster.get_json(f"/api/v1/nodes/{name}")
        has = node["status"].get("allocatable", {}).get("aliyun.com/gpu-mem") == "30"
        return node["metadata"].get("annotations", {}) if has else {}

    annotations = wait_for(published, 120, every=1)
    assert annotations.get("gpushare-hub.io/device-mode") == "legacy", annotations
    on_it = {"schedulerName": "gpushare-scheduler", "nodeSelector": {"kubernetes.io/hostname": name}}
    manifests = [
        plain_pod(stack, "legacy-no-slice", {}, nodeSelector={"kubernetes.io/hostname": name}),
        plain_pod(stack, "legacy-aliyun-style", {"aliyun.com/gpu-mem": "3"}, **on_it),
        plain_pod(stack, "legacy-whole-card", {"aliyun.com/gpu-count": "1"}, **on_it),
    ]
    names = [m["metadata"]["name"] for m in manifests]
    try:
        apply_ready(stack, manifests)
        assert nvidia_devices(stack, "legacy-no-slice", "default") == set()
        aliyun, whole = _pod(stack, "legacy-aliyun-style"), _pod(stack, "legacy-whole-card")
        assert aliyun["spec"]["nodeName"] == whole["spec"]["nodeName"] == name
        assert card_of(aliyun) != card_of(whole)
        for pod in (aliyun, whole):
            pod_name = pod["metadata"]["name"]
            assert nvidia_devices(stack, pod_name, "default") == {
                f"nvidia{index_of(stack, pod)}",
                *CONTROL_NODES,
            }
            env = exec_in(
                stack, "default", pod_name, "printenv", "NVIDIA_VISIBLE_DEVICES", "GPUSHARE_CARD_UUIDS"
            )
            assert env.split() == [card_of(pod), card_of(pod)], env
        # The slice's start-up hook reaches the container in this mode too: on its path, read-only.
        path = exec_in(stack, "default", "legacy-aliyun-style", "printenv", "PYTHONPATH")
        assert HOOK_CONTAINER_PATH in path.strip().split(":"), path
        assert_hook_mounted_read_only(stack, "default", "legacy-aliyun-style")
    finally:
        delete_pods(stack, names)


def assert_hook_mounted_read_only(stack: RealStack, namespace: str, pod: str) -> None:
    """The start-up hook's folder is mounted in the container, read-only."""
    mounts = exec_in(stack, namespace, pod, "cat", "/proc/self/mounts")
    (line,) = [m for m in mounts.splitlines() if m.split()[1] == HOOK_CONTAINER_PATH]
    assert "ro" in line.split()[3].split(","), line


def delete_pods(stack: RealStack, names: Sequence[str]) -> None:
    """Delete these pods of ``default`` at once, and wait until they are gone."""
    kubectl(stack, "delete", "pods", "--namespace=default", "--wait=true", "--grace-period=0",
            "--ignore-not-found", *names)  # fmt: skip


def apply_ready(stack: RealStack, manifests: list[dict[str, Any]]) -> None:
    """``kubectl apply`` each pod into ``default``, then wait until every one is Ready."""
    for body in manifests:
        path = stack.cluster.workdir / f"{body['metadata']['name']}.json"
        path.write_text(json.dumps(body))
        kubectl(stack, "apply", "--namespace=default", f"--filename={path}")
    for name in (m["metadata"]["name"] for m in manifests):
        assert wait_for(lambda n=name: ready(_pod(stack, n)), 120, every=1), _pod(stack, name)["status"]


def _pod(stack: RealStack, name: str) -> dict[str, Any]:
    return dict(stack.cluster.get_json(f"/api/v1/namespaces/default/pods/{name}"))


def terminal_env(stack: RealStack, hub: Hub, user: str) -> dict[str, str]:
    """The environment a Jupyter terminal gets: started through the notebook server's REST API,
    read over its websocket, as JupyterLab does."""
    import asyncio

    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    status, term = hub.call("POST", f"/user/{user}/api/terminals")
    assert status in (200, 201), term
    ws_url = stack.hub_url.replace("http://", "ws://") + f"/user/{user}/terminals/websocket/{term['name']}"

    async def read() -> str:
        conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {hub.token}"}))
        await conn.write_message(json.dumps(["stdin", "env; echo __END__\r"]))
        out = ""
        deadline = time.monotonic() + 30
        while "__END__\r\n" not in out.replace("echo __END__", "") and time.monotonic() < deadline:
            msg = await asyncio.wait_for(conn.read_message(), 30)
            if msg is None:
                break
            kind, *rest = json.loads(msg)
            if kind == "stdout":
                out += rest[0]
        conn.close()
        return out

    out = asyncio.run(read())
    hub.call("DELETE", f"/user/{user}/api/terminals/{term['name']}")
    return dict(
        line.strip().split("=", 1)
        for line in out.splitlines()
        if "=" in line and " " not in line.split("=")[0]
    )


# ---- 4. upgrade and kubelet restart ------------------------------------------------------------
def test_upgrade_and_kubelet_restart_keep_the_notebooks(stack: RealStack, hub: Hub) -> None:
    before = {u: notebook_pod(stack, u) for u in USERS}
    status, ledger_before = hub.call("GET", "/services/gpushare/api/v1/ledger")
    assert status == 200
    offered_before = gpu_memory_offered(stack)
    node = next(iter(stack.nodes.nodes))
    # A later release in the registry: the chart at the next version, whose appVersion names new
    # extender and plugin images (rebuilt: new digests) that no node holds yet.
    old_version = stack.gpushare_install_argvs()[-1][5]
    major, minor, patch = re.match(r"(\d+)\.(\d+)\.(\d+)", old_version).groups()  # type: ignore[union-attr]
    new_version = f"{major}.{minor}.{int(patch) + 1}"
    pushed = stack.publish_upgrade(new_version)
    stack.run(
        "helm", "upgrade", "gpushare-hub", stack.chart, f"--version={new_version}", "--plain-http",
        f"--namespace={GPUSHARE_NAMESPACE}", "--reuse-values", "--wait", "--timeout=5m",
    )  # fmt: skip

    def upgraded() -> bool:  # the old pods may still be terminating when helm's --wait returns
        live = [p for p in pods(stack, GPUSHARE_NAMESPACE) if not p["metadata"].get("deletionTimestamp")]
        images = [c["image"] for p in live for c in p["spec"]["containers"] if c["name"] != "kube-scheduler"]
        expected = 2 + len(stack.nodes.nodes)  # two scheduler replicas' extenders, a plugin per node
        return (
            len(images) == expected
            and all(i.endswith(f":{new_version}") for i in images)
            and all(map(ready, live))
        )

    assert wait_for(upgraded, 120, every=1), [
        (p["metadata"]["name"], [c["image"] for c in p["spec"]["containers"]])
        for p in pods(stack, GPUSHARE_NAMESPACE)
    ]
    # Each node pulled the new images from the registry: their digests, not the old release's.
    for pod in pods(stack, GPUSHARE_NAMESPACE):
        for status in pod["status"]["containerStatuses"]:
            name, tag = status["image"].rsplit(":", 1)
            if status["name"] == "kube-scheduler" or pod["metadata"].get("deletionTimestamp"):
                continue
            repository = name.split("/", 1)[1]
            assert f"{stack.registry.address}/{repository}:{tag}" in pushed.values(), (status, pushed)
            digest = stack.registry.digest(repository, new_version)
            assert digest != stack.registry.digest(repository, old_version)
            assert status["imageID"] == f"{name}@{digest}", status
    for user in USERS:
        after = notebook_pod(stack, user)
        assert after["metadata"]["uid"] == before[user]["metadata"]["uid"]
        assert restarts(after) == 0 and ready(after), after["status"]
        assert card_of(after) == card_of(before[user])
    status, ledger_after = hub.call("GET", "/services/gpushare/api/v1/ledger")
    assert status == 200
    assert _holdings(ledger_after) == _holdings(ledger_before)
    # Each node's kubelet offers its GPU memory again once the new plugin registered: until then
    # kube-scheduler's resource filter takes the node out, and a spawn goes to another node.
    assert wait_for(lambda: gpu_memory_offered(stack) == offered_before, 120, every=1), (
        gpu_memory_offered(stack),
        offered_before,
    )

    spawn(hub, "carol", SLICE)
    wait_ready(hub, "carol", stack)
    assert card_of(notebook_pod(stack, "carol")) == card_of(before["alice"]), (
        "binpack: the fullest card that fits"
    )

    registrations = _registrations(stack)
    restarted = time.time()
    stack.nodes.restart_kubelet(node)
    assert wait_for(lambda: _registrations(stack) > registrations, 90, every=2), _plugin_log(stack)[-30:]

    def reported_after_restart() -> str | None:  # the restarted kubelet's own node status
        status = stack.cluster.get_json(f"/api/v1/nodes/{node}")["status"]
        (cond,) = [c for c in status["conditions"] if c["type"] == "Ready"]
        beat = datetime.fromisoformat(cond["lastHeartbeatTime"].replace("Z", "+00:00")).timestamp()
        return status["allocatable"].get("aliyun.com/gpu-mem") if beat > restarted + 1 else None

    assert wait_for(reported_after_restart, 90, every=1) == "30"
    for user in USERS:
        pod = notebook_pod(stack, user)
        name = pod["metadata"]["name"]
        env = wait_for(lambda n=name: _try_exec(stack, n, "printenv", "GPUSHARE_CARD_UUIDS"), 60, every=1)
        assert env.strip() == card_of(pod), env
        assert restarts(pod) == 0


def gpu_memory_offered(stack: RealStack) -> dict[str, str | None]:
    """Each real node's allocatable ``aliyun.com/gpu-mem``, as its kubelet reports it."""
    return {
        name: stack.cluster.get_json(f"/api/v1/nodes/{name}")["status"]
        .get("allocatable", {})
        .get("aliyun.com/gpu-mem")
        for name in stack.nodes.nodes
    }


def _holdings(ledger: Any) -> set[tuple[str, str, str, str, int]]:
    """What the ledger says is held: (node, pod, hub user, card, units) per allocation."""
    return {(a["node"], a["pod"], a["hub_user"], a["card_uuid"], a["units"]) for a in ledger["allocations"]}


def _try_exec(stack: RealStack, pod: str, *argv: str, namespace: str = HUB_NAMESPACE) -> str:
    """``kubectl exec``'s output, or "" while the kubelet does not serve exec (yet)."""
    try:
        return exec_in(stack, namespace, pod, *argv)
    except HarnessError:
        return ""


def _registrations(stack: RealStack) -> int:
    """How often the plugin has registered with the kubelet (its log's "registered ... with the
    kubelet" lines)."""
    return sum(" with the kubelet (" in line and "registered" in line for line in _plugin_log(stack))


def _plugin_log(stack: RealStack) -> list[str]:
    """The first node's device plugin's log; empty while its kubelet does not serve logs (restarting)."""
    first = next(iter(stack.nodes.nodes))
    plugins = pods(stack, GPUSHARE_NAMESPACE, "app.kubernetes.io/component=device-plugin")
    (pod,) = [p for p in plugins if p["spec"].get("nodeName") == first]
    try:
        return kubectl(
            stack, "logs", f"--namespace={GPUSHARE_NAMESPACE}", pod["metadata"]["name"]
        ).splitlines()
    except HarnessError:
        return []


# ---- 5. uninstall ------------------------------------------------------------------------------
def test_uninstall_leaves_nothing_of_ours(stack: RealStack, hub: Hub) -> None:
    for user in (*USERS, "carol"):
        hub.call("DELETE", f"/hub/api/users/{user}/server")
    assert wait_for(lambda: not pods(stack, HUB_NAMESPACE, "component=singleuser-server"), 120, every=1)
    node, second = list(stack.nodes.nodes)[:2]  # the first node and the legacy one
    for block in (doc_block("uninstall-z2jh", "node-tier"), doc_block("uninstall")):
        for raw in block.commands():
            argv = substitute(raw, {"<gpu-node-1>": node, "<gpu-node-2>": second})
            labels = argv[:3] in (["kubectl", "label", "node"], ["kubectl", "annotate", "node"])
            proc = subprocess.run(
                [str(stack.helm if argv[0] == "helm" else stack.kubectl), *argv[1:]],
                cwd=ROOT,
                env=inspect_env(stack),
                capture_output=True,
                text=True,
                timeout=300,
            )
            # Only removing a label or annotation that was never written may say "not found".
            assert proc.returncode == 0 or (labels and "not found" in proc.stderr), (
                shlex.join(argv),
                proc.stderr,
            )
    leftovers = kubectl(
        stack, "get", "all,configmaps,secrets,serviceaccounts,roles,rolebindings,leases,poddisruptionbudgets,"
        "clusterroles,clusterrolebindings,validatingadmissionpolicies,validatingadmissionpolicybindings",
        "--all-namespaces", "--selector=app.kubernetes.io/name=gpushare-hub", "--output=name",
    )  # fmt: skip
    assert leftovers.strip() == "", leftovers
    namespaces = {n["metadata"]["name"] for n in stack.cluster.get_json("/api/v1/namespaces")["items"]}
    assert wait_for(
        lambda: (
            not {GPUSHARE_NAMESPACE, HUB_NAMESPACE}
            & {n["metadata"]["name"] for n in stack.cluster.get_json("/api/v1/namespaces")["items"]}
        ),
        120,
        every=1,
    ), namespaces
    for each in (node, second):
        plugin_dir = stack.nodes.host_path(each, "/var/lib/kubelet/device-plugins")
        assert wait_for(lambda d=plugin_dir: not [p for p in d.iterdir() if "gpushare" in p.name], 30), list(
            plugin_dir.iterdir()
        )
        ours = [
            stack.nodes.host_path(each, "/var/lib/gpushare-hub"),
            stack.nodes.host_path(each, "/run/gpushare-hub"),
        ]
        files = [f for folder in ours for f in folder.rglob("*") if not f.is_dir()]
        # The plugin's CDI spec goes with it; the toolkit's management spec stays.
        files += list(stack.nodes.host_path(each, "/var/run/cdi").glob("gpushare-hub.io*"))
        assert files == [], f"files the device plugin left on {each}"
        annotations = stack.cluster.get_json(f"/api/v1/nodes/{each}")["metadata"].get("annotations", {})
        assert not [a for a in annotations if a.startswith("gpushare-hub.io/")], annotations


# ---- a second node ----------------------------------------------------------------------------
def test_pods_on_the_second_real_node_reach_the_first_nodes_by_service_name(stack: RealStack) -> None:
    first, second = list(stack.nodes.nodes)[:2]  # the second joined as the legacy node
    image = stack.names["singleuser"]  # any image with python3

    def pod(name: str, node: str, command: list[str], labels: dict[str, str]) -> dict[str, Any]:
        container = {"name": "c", "image": image, "imagePullPolicy": "IfNotPresent", "command": command}
        return {
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [container]},
        }

    core = stack.cluster.core_api()
    core.create_namespaced_pod(
        "default", pod("web", first, ["python3", "-m", "http.server", "8080"], {"app": "web"})
    )
    core.create_namespaced_service(
        "default",
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    core.create_namespaced_pod("default", pod("client", second, ["sleep", "600"], {}))
    assert wait_for(
        lambda: all(ready(p) for p in pods(stack, "default")) and len(pods(stack, "default")) == 2, 120
    )
    url = "http://web.default.svc.cluster.local/"
    fetch = f"import urllib.request as u; print(u.urlopen({url!r}, timeout=5).status)"
    out = wait_for(
        lambda: _try_exec(stack, "client", "python3", "-c", fetch, namespace="default"), 60, every=1
    )
    assert out.strip() == "200", out
    client_ip = stack.cluster.get_json("/api/v1/namespaces/default/pods/client")["status"]["podIP"]
    assert client_ip.startswith("10.244.1."), client_ip  # the second node's pod range
    assert client_ip in kubectl(stack, "logs", "--namespace=default", "web"), (
        "the request came from the second node"
    )
    kubectl(stack, "delete", "--namespace=default", "pod/web", "pod/client", "service/web", "--wait")


# ---- the command line ------------------------------------------------------------------------
def test_localcluster_up_with_real_nodes_and_z2jh_writes_a_ready_file_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    """``gpushare-localcluster up --real-nodes 1 --z2jh --ready-file PATH``, beside the tier's own
    cluster (whose charts are uninstalled by now): its own namespaces, its own 127.0.0.1 ports."""
    import os
    import signal
    import sys

    from gpushare_hub.localcluster import netns

    ready_file = tmp_path / "up.json"
    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpushare_hub.localcluster.cli", "up", "--real-nodes", "1", "--z2jh",
         "--ready-file", str(ready_file)],
        stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ),
    )  # fmt: skip
    try:
        assert wait_for(lambda: ready_file.exists() or proc.poll() is not None, 900, every=2)
        assert proc.poll() is None, (tmp_path / "up.log").read_text()[-4000:]
        info = json.loads(ready_file.read_text())
        assert {"kubeconfig", "hub_url", "admin_token", "namespace"} <= set(info), info
        assert info["hub_url"].startswith("http://127.0.0.1:")
        hub = Hub(info["hub_url"], info["admin_token"])
        status, users = hub.call("GET", "/hub/api/users")
        assert status == 200 and isinstance(users, list), users
        status, _ = hub.call("GET", "/hub/api/users", token="not-a-token")
        assert status == 403
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    assert code == 0, (tmp_path / "up.log").read_text()[-4000:]
    prefix = f"gsh{proc.pid % 100000:05d}"  # LocalCluster names its namespaces after its process
    assert not netns.cluster_namespaces(prefix), "network namespaces left behind"
    workdir = re.search(r"export KUBECONFIG=(\S+)/pki/", (tmp_path / "up.log").read_text())
    assert workdir, (tmp_path / "up.log").read_text()[-2000:]
    leftover = subprocess.run(["pgrep", "-f", workdir[1]], capture_output=True, text=True)
    assert leftover.returncode == 1, f"processes left behind: {leftover.stdout}"
    assert workdir[1] not in Path("/proc/self/mountinfo").read_text(), "mounts left behind"
