"""A plain KubeSpawner's notebooks, placed by our scheduler and extender, run on local notebook nodes."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest
from kubernetes.client.exceptions import ApiException

from gpushare_hub.core.names import ALLOCATION_ANNOTATION
from gpushare_hub.localcluster.nodeagent import start_ticks
from gpushare_hub.localcluster.notebooknodes import LABEL, NOTEBOOK_IMAGE
from tests.conftest import gpu_pod, wait_for
from tests.support.hub_helpers import (
    NAMESPACE,
    SCHEDULER,
    pod_of,
    record_of,
    run_in_kernel,
    start_server,
    stop_server,
)


def chosen_card(pod: dict) -> str:
    return json.loads(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])["cards"][0]["uuid"]


def alive(pid: int) -> bool:
    return start_ticks(pid) is not None


def test_a_spawned_server_is_placed_by_the_extender_run_reached_through_the_proxy_and_stopped(
    local_cluster, hub, notebook_nodes
):
    token, _ = start_server(hub, "alice")
    pod = pod_of(local_cluster, "alice")
    assert pod is not None
    assert pod["spec"]["schedulerName"] == SCHEDULER
    assert pod["spec"]["nodeName"] in notebook_nodes.nodes
    assert ALLOCATION_ANNOTATION in pod["metadata"]["annotations"], "the extender did not place it"
    status, body = hub.proxy_get("/user/alice/api/status", token)
    assert status == 200, body
    rec = record_of(notebook_nodes, pod["metadata"]["uid"])
    assert rec is not None and alive(rec.pid)
    stop_server(hub, local_cluster, "alice")
    assert wait_for(lambda: not alive(rec.pid), timeout=60), "the notebook's process outlived its pod"


def test_a_5_gib_notebook_sees_the_card_the_extender_chose_its_limit_and_the_hook(
    local_cluster, hub, notebook_nodes
):
    token, _ = start_server(hub, "bob", "slice-5")
    try:
        pod = pod_of(local_cluster, "bob")
        code = (
            "import os, sys, json; env = {k: os.environ.get(k) for k in "
            "['NVIDIA_VISIBLE_DEVICES', 'CUDA_DEVICE_MEMORY_LIMIT_0', 'ALIYUN_COM_GPU_MEM_CONTAINER']}; "
            "env['hook'] = getattr(sys.modules.get('sitecustomize'), '__file__', None); "
            "print(json.dumps(env))"
        )
        env = json.loads(run_in_kernel(hub, "bob", token, code))
        assert env["NVIDIA_VISIBLE_DEVICES"] == chosen_card(pod)
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5120m"
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "5"
        # Allocate's start-up hook mount, as a host path: the kernel loaded the hook.
        node = pod["spec"]["nodeName"]
        assert env["hook"] == str(notebook_nodes.state_dir / "nodes" / node / "pyhook" / "sitecustomize.py")
        assert (
            local_cluster.get_json(f"/api/v1/namespaces/{NAMESPACE}/pods/jupyter-bob")["metadata"][
                "annotations"
            ]["ALIYUN_COM_GPU_MEM_ASSIGNED"]
            == "true"
        )
    finally:
        stop_server(hub, local_cluster, "bob")


def test_two_notebooks_on_two_nodes_answer_at_their_own_pod_ips_at_once(local_cluster, hub):
    """10 GiB twice cannot share a 15 GiB card: the extender puts them on nb-1 and nb-2."""
    users = ["carol", "dave"]
    tokens = {u: start_server(hub, u, "slice-10")[0] for u in users}
    try:
        pods = {u: pod_of(local_cluster, u) for u in users}
        assert {p["spec"]["nodeName"] for p in pods.values()} == {"nb-1", "nb-2"}
        ips = {u: p["status"]["podIP"] for u, p in pods.items()}
        assert len(set(ips.values())) == 2 and all(ip.startswith("127.") for ip in ips.values())
        for u in users:
            req = urllib.request.Request(
                f"http://{ips[u]}:8888/user/{u}/api/status", headers={"Authorization": f"token {tokens[u]}"}
            )
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert resp.status == 200
            assert hub.proxy_get(f"/user/{u}/api/status", tokens[u])[0] == 200
    finally:
        for u in users:
            stop_server(hub, local_cluster, u)


def test_killing_the_agent_loses_no_running_notebook_and_the_new_agent_adopts_it(
    local_cluster, hub, notebook_nodes
):
    token, _ = start_server(hub, "erin")
    pod = pod_of(local_cluster, "erin")
    rec = record_of(notebook_nodes, pod["metadata"]["uid"])
    assert rec is not None
    notebook_nodes.kill_agent()
    assert alive(rec.pid)
    notebook_nodes.start()
    assert wait_for(
        lambda: "adopted container notebook of pod hub/jupyter-erin" in notebook_nodes.agent_log().read_text()
    )
    assert alive(rec.pid) and record_of(notebook_nodes, pod["metadata"]["uid"]).pid == rec.pid
    assert hub.proxy_get("/user/erin/api/status", token)[0] == 200
    # The adopted notebook is still the agent's: deleting the pod ends it.
    stop_server(hub, local_cluster, "erin")
    assert wait_for(lambda: not alive(rec.pid), timeout=60)


def test_a_pod_of_an_unknown_image_stays_kwok_only_and_the_agent_says_so_once(
    local_cluster, hub, notebook_nodes
):
    api = local_cluster.core_api()
    api.create_namespaced_pod(NAMESPACE, gpu_pod("other-image", 1, SCHEDULER, {LABEL: "true"}))
    try:
        running = wait_for(
            lambda: api.read_namespaced_pod("other-image", NAMESPACE).status.phase == "Running", timeout=60
        )
        assert running
        line = "pod hub/other-image: image quay.io/jupyter/base-notebook is not one this agent runs"
        assert wait_for(lambda: line in notebook_nodes.agent_log().read_text(), timeout=30)
        # Positive evidence of later reconcile rounds: each goes over every pod the agent knows,
        # so the round that speaks of a second such pod went over the first one again.
        api.create_namespaced_pod(NAMESPACE, gpu_pod("other-image-2", 1, SCHEDULER, {LABEL: "true"}))
        second = "pod hub/other-image-2: image quay.io/jupyter/base-notebook is not one this agent runs"
        assert wait_for(lambda: second in notebook_nodes.agent_log().read_text(), timeout=60)
        assert notebook_nodes.agent_log().read_text().count(line) == 1
        uid = api.read_namespaced_pod("other-image", NAMESPACE).metadata.uid
        assert record_of(notebook_nodes, uid) is None
    finally:
        for name in ("other-image", "other-image-2"):
            try:
                api.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
            except ApiException as err:
                if err.status != 404:
                    raise


def test_a_command_that_exits_at_once_fails_the_pod_with_its_code_and_last_output(local_cluster, hub):
    api = local_cluster.core_api()
    body = gpu_pod("crashes", 1, SCHEDULER, {LABEL: "true"})
    body["spec"]["restartPolicy"] = "Never"
    body["spec"]["containers"][0].update(
        image=NOTEBOOK_IMAGE,
        command=["python", "-c", "import sys; print('cannot read /etc/notebook.conf'); sys.exit(3)"],
    )
    api.create_namespaced_pod(NAMESPACE, body)
    try:
        failed = wait_for(
            lambda: (p := api.read_namespaced_pod("crashes", NAMESPACE)).status.phase == "Failed" and p,
            timeout=90,
        )
        assert failed, api.read_namespaced_pod("crashes", NAMESPACE).status
        assert "exited with code 3" in failed.status.message
        assert "cannot read /etc/notebook.conf" in failed.status.message
        term = failed.status.container_statuses[0].state.terminated
        assert term.exit_code == 3
        events = api.list_namespaced_event(NAMESPACE, field_selector="involvedObject.name=crashes").items
        assert any("exited with code 3" in (e.message or "") for e in events)
    finally:
        api.delete_namespaced_pod("crashes", NAMESPACE, grace_period_seconds=0)


pytestmark = pytest.mark.timeout(600)


def test_a_notebook_command_that_exits_at_once_shows_in_the_spawn_progress(local_cluster, hub):
    """The spawn page's messages carry the exit code and the output, and the spawn ends, in either
    order of the two things that race here: kwok marking the pod Running, and the node agent
    reporting the exit. Seen Running first, KubeSpawner's start returns and the hub waits for the
    server (http_timeout 30 s) while GPUShareSpawner's progress goes on showing the pod's events;
    seen Failed first, GPUShareSpawner ends the spawn with the exit at once, where KubeSpawner
    alone waited out its start_timeout (300 s) for a Running pod that never came."""
    token = hub.user_token("frank")
    spawn = threading.Thread(target=hub.api, args=("POST", "/users/frank/server", {"profile": "broken"}))
    spawn.start()
    try:
        assert wait_for(lambda: hub.api("GET", "/users/frank")[1].get("pending") == "spawn", timeout=30)
        req = urllib.request.Request(
            f"{hub.url}/hub/api/users/frank/server/progress", headers={"Authorization": f"token {token}"}
        )
        events = []
        # The stream ends when the spawn does: at once on the exit, or at the hub's give-up.
        with urllib.request.urlopen(req, timeout=240) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
        messages = [str(e.get("message", "")) for e in events]
        # The agent's part: the exit code and the output are on a Warning event of the pod.
        pod_events = local_cluster.core_api().list_namespaced_event(
            NAMESPACE, field_selector="involvedObject.name=jupyter-frank"
        )
        assert any(
            e.type == "Warning"
            and "exited with code 3" in e.message
            and "cannot read /etc/notebook.conf" in e.message
            for e in pod_events.items
        ), [e.message for e in pod_events.items]
        # The user's part, whatever the order: the page says why, then that the spawn failed.
        assert any("exited with code 3" in m and "cannot read /etc/notebook.conf" in m for m in messages), (
            messages
        )
        assert events and events[-1].get("failed") is True, events[-1:]
    finally:
        spawn.join(timeout=240)
        # The spawn has ended (the stream above ended with it) and KubeSpawner deletes the pod.
        assert wait_for(lambda: not hub.api("GET", "/users/frank")[1].get("pending"), timeout=120)
        assert wait_for(lambda: pod_of(local_cluster, "frank") is None, timeout=120)
