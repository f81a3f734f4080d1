"""What a pod on a local notebook node becomes as a process, and how its exit reads (pure)."""

from __future__ import annotations

import pytest

from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.localcluster.nodeagent import parse_node
from gpushare_hub.localcluster.podprocess import (
    Exit,
    KnownImage,
    Mount,
    NotRunnable,
    exit_status,
    expand,
    parse_image,
    process_spec,
)

IMAGE = KnownImage("gpushare-hub/notebook:local", "/venv/bin")


def kubespawner_pod(**container):
    """The shape KubeSpawner gives a notebook pod (cmd in args, the bind address in the env)."""
    c = {
        "name": "notebook",
        "image": IMAGE.name,
        "args": ["jupyterhub-singleuser", "--ip=0.0.0.0"],
        "env": [
            {"name": "JUPYTERHUB_SERVICE_URL", "value": "http://0.0.0.0:8888/user/alice/"},
            {"name": "JUPYTERHUB_USER", "value": "alice"},
            {"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        ],
        **container,
    }
    return {
        "metadata": {"name": "jupyter-alice", "namespace": "hub", "uid": "u1"},
        "spec": {"nodeName": "nb-1", "containers": [c]},
    }


def test_a_kubespawner_pod_binds_to_its_pod_ip_with_the_plugins_env_and_the_image_first_on_path():
    pod = kubespawner_pod()
    spec = process_spec(
        pod,
        pod["spec"]["containers"][0],
        IMAGE,
        "127.10.1.5",
        "/state/u1/home",
        device_env={"NVIDIA_VISIBLE_DEVICES": "GPU-abc", "CUDA_DEVICE_MEMORY_LIMIT_0": "5120m"},
    )
    assert spec.argv == ("jupyterhub-singleuser", "--ip=127.10.1.5")
    assert spec.env["JUPYTERHUB_SERVICE_URL"] == "http://127.10.1.5:8888/user/alice/"
    assert spec.env["NVIDIA_VISIBLE_DEVICES"] == "GPU-abc"
    assert spec.env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5120m"
    assert spec.env["PATH"].startswith("/venv/bin:")
    assert spec.env["MY_POD"] == "jupyter-alice" and spec.env["MY_IP"] == "127.10.1.5"
    assert "SECRET" not in spec.env
    assert spec.env["HOME"] == spec.cwd == "/state/u1/home"


def test_the_containers_own_env_wins_over_the_plugins_as_a_runtime_takes_them():
    pod = kubespawner_pod(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])
    spec = process_spec(
        pod, pod["spec"]["containers"][0], IMAGE, "127.10.1.5", "/h", {"NVIDIA_VISIBLE_DEVICES": "GPU-abc"}
    )
    assert spec.env["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_allocate_env_paths_inside_a_mount_point_at_its_host_folder_and_mounts_are_named():
    pod = kubespawner_pod()
    spec = process_spec(
        pod,
        pod["spec"]["containers"][0],
        IMAGE,
        "127.0.0.9",
        "/h",
        device_env={"PYTHONPATH": "/opt/hook:/opt/hook/sub:/elsewhere", "PIPE": "/opt/hooked"},
        mounts=[Mount("/host/hook", "/opt/hook")],
    )
    assert spec.env["PYTHONPATH"] == "/host/hook:/host/hook/sub:/elsewhere"
    assert spec.env["PIPE"] == "/opt/hooked"  # a sibling path, not under the mount
    assert spec.env["GPUSHARE_BIND_MOUNTS"] == "/host/hook:/opt/hook"


def test_command_and_args_expand_variables_as_kubernetes_does():
    pod = kubespawner_pod(
        command=["sh", "-c"], args=["echo $(JUPYTERHUB_USER) $$(JUPYTERHUB_USER) $(NOPE)"], workingDir="/work"
    )
    spec = process_spec(pod, pod["spec"]["containers"][0], IMAGE, "127.0.0.9", "/h")
    assert spec.argv == ("sh", "-c", "echo alice $(JUPYTERHUB_USER) $(NOPE)")
    assert spec.cwd == "/work"
    assert expand("$$", {}) == "$"


def test_a_container_without_command_or_args_is_refused_with_the_fix():
    pod = kubespawner_pod(args=[])
    with pytest.raises(NotRunnable, match=r"c\.KubeSpawner\.cmd"):
        process_spec(pod, pod["spec"]["containers"][0], IMAGE, "127.0.0.9", "/h")


def test_an_exit_with_an_error_fails_the_pod_with_the_code_and_the_last_output():
    body = exit_status(Exit("notebook", IMAGE.name, 3, "line 1\nboom: bad config\n", "t0", "t1"))
    status = body["status"]
    assert status["phase"] == "Failed"
    assert "exited with code 3" in status["message"] and "boom: bad config" in status["message"]
    term = status["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"


def test_a_clean_exit_succeeds_and_a_vanished_process_reads_as_killed():
    assert exit_status(Exit("nb", "i", 0, "bye", "t0", "t1"))["status"]["phase"] == "Succeeded"
    killed = exit_status(Exit("nb", "i", None, "", "t0", "t1"))["status"]
    assert killed["phase"] == "Failed"
    assert killed["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137


@pytest.mark.parametrize("bad", ["no-equals", "=/bin", "name="])
def test_bad_image_and_node_options_name_the_form_to_write(bad):
    with pytest.raises(GPUShareError, match="NAME=BIN_DIR"):
        parse_image(bad)
    with pytest.raises(GPUShareError, match="NAME=CARDS"):
        parse_node(bad)


def test_an_overcommitted_nodes_door_and_answers_are_host_folders_for_a_local_notebook():
    """The device plugin's Allocate on a node with --overcommit above 1 mounts two folders; the
    local notebook finds them through the environment, rewritten to their host paths."""
    pod = kubespawner_pod()
    spec = process_spec(
        pod,
        pod["spec"]["containers"][0],
        IMAGE,
        "127.0.0.9",
        "/h",
        device_env={
            "GPUSHARE_DOOR_DIR": "/run/gpushare-hub/door",
            "GPUSHARE_ANSWER_DIR": "/run/gpushare-hub/answer",
        },
        mounts=[
            Mount("/state/nodes/nb-1/hibernation/doors/u-1", "/run/gpushare-hub/door"),
            Mount("/state/nodes/nb-1/hibernation/answers/u-1", "/run/gpushare-hub/answer"),
        ],
    )
    assert spec.env["GPUSHARE_DOOR_DIR"] == "/state/nodes/nb-1/hibernation/doors/u-1"
    assert spec.env["GPUSHARE_ANSWER_DIR"] == "/state/nodes/nb-1/hibernation/answers/u-1"
