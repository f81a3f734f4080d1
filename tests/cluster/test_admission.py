"""The admission policies against the real API server: forgeries refused, the plugin as narrow as a kubelet.

These tests run their own control plane: the policies bind cluster-wide, and the
session cluster's other tests (and the kubelet tier's plugin, which has no
node-bound token) write annotations as the admin or a plain client certificate.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpushare_hub.core import AllocationRecord, CardShare
from gpushare_hub.core.cards import declared_cards
from gpushare_hub.core.names import ALLOCATION_ANNOTATION, CARDS_ANNOTATION, GPU_MEM_ASSIGNED, GPU_MEM_IDX
from gpushare_hub.core.resources import DEFAULT_NAMES
from gpushare_hub.kube.kubeconfig import Access
from gpushare_hub.kube.rest import RestClient
from gpushare_hub.plugin.kube import KubePods, KubeUsageSink, publish_isolation, publish_node
from tests.conftest import gpu_pod, running_cluster, wait_for
from tests.support.admission import PLUGIN_USER, SCHED, SYSTEM_NS, Guarded, denial, plain


@pytest.fixture(scope="module")
def guarded() -> Iterator[Guarded]:
    with running_cluster(scheduler=False) as cluster:
        yield Guarded(cluster)


def test_a_users_forged_annotations_are_refused_on_create_and_patch_and_the_extender_still_binds(guarded):
    alice, admin = guarded.alice, guarded.admin
    record = AllocationRecord("gpu-1", (CardShare("GPU-sim-gpu-1-0", 0, 15),), ()).to_json()
    for name, ann in (
        ("forged", {ALLOCATION_ANNOTATION: record}),
        ("legacy", {GPU_MEM_IDX: "0", "ALIYUN_COM_GPU_MEM_POD": "15"}),
        ("chooser", {"gpushare-hub.io/policy": "spread"}),  # users choose no policy unless allowed
    ):
        with pytest.raises(ApiException) as err:
            alice.create_namespaced_pod("alice", plain(name, ann))
        assert err.value.status == 403
        message = denial(err.value)
        assert "written only by the gpushare extender (gpushare-extender)" in message, message
        assert "alice may not set" in message and next(iter(ann)) in message
    # The hub may write an admin's policy choice, and only that.
    guarded.hub.create_namespaced_pod("alice", plain("profiled", {"gpushare-hub.io/policy": "spread"}))
    with pytest.raises(ApiException) as err:
        guarded.hub.create_namespaced_pod("alice", plain("hubforged", {GPU_MEM_IDX: "0"}))
    assert err.value.status == 403 and "the-hub may not set" in denial(err.value)
    # Card-model annotations are the user's to set; the extender's bind writes its record.
    body = gpu_pod("nb", 5, SCHED)
    body["metadata"]["annotations"] = {"gpushare-hub.io/card-models": "T4"}
    alice.create_namespaced_pod("alice", body)
    assert wait_for(lambda: admin.read_namespaced_pod("nb", "alice").spec.node_name, timeout=60)
    ann = admin.read_namespaced_pod("nb", "alice").metadata.annotations
    assert ALLOCATION_ANNOTATION in ann and ann["ALIYUN_COM_GPU_MEM_POD"] == "5"
    # Changing or removing it afterwards is refused too.
    for patch in (
        {"metadata": {"annotations": {GPU_MEM_IDX: "1"}}},
        {"metadata": {"annotations": {ALLOCATION_ANNOTATION: None}}},
        {"metadata": {"annotations": {GPU_MEM_ASSIGNED: "true"}}},
    ):
        with pytest.raises(ApiException) as err:
            alice.patch_namespaced_pod("nb", "alice", patch)
        assert err.value.status == 403 and "may not set" in denial(err.value)
    assert admin.read_namespaced_pod("nb", "alice").metadata.annotations == ann
    # Other changes to one's own pod stay allowed.
    alice.patch_namespaced_pod("nb", "alice", {"metadata": {"labels": {"mine": "yes"}}})
    # The node inventory is the plugin's: a user allowed to patch Nodes still may not set it.
    for key in (CARDS_ANNOTATION, "gpushare-hub.io/mps-servers"):  # a forged MPS UID misleads users
        with pytest.raises(ApiException) as err:
            alice.patch_node("gpu-1", {"metadata": {"annotations": {key: "{}"}}})
        assert err.value.status == 403
        assert "written only by the gpushare device plugin" in denial(err.value)


def test_the_plugins_token_reaches_only_its_own_node_and_the_pods_bound_to_it(guarded):
    admin = guarded.admin
    plugin, user = guarded.plugin_api("gpu-1")
    assert user["username"] == PLUGIN_USER
    assert user["extra"]["authentication.kubernetes.io/node-name"] == ["gpu-1"]
    # RBAC alone lets every plugin patch any pod and Node; it may create no binding and read no secret.
    sar = client.AuthorizationV1Api(guarded.cluster.api_client())

    def allowed(verb: str, resource: str, subresource: str = "") -> bool:
        review = sar.create_subject_access_review(
            {
                "spec": {
                    "user": PLUGIN_USER,
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{SYSTEM_NS}"],
                    "resourceAttributes": {"verb": verb, "resource": resource, "subresource": subresource},
                }
            }
        )
        return bool(review.status.allowed)

    assert allowed("patch", "pods") and allowed("patch", "nodes")
    assert not allowed("create", "pods", "binding") and not allowed("get", "secrets")
    assert not allowed("delete", "pods") and not allowed("update", "nodes")
    # So the policy narrows it: two pods placed by the extender, one per node.
    for i, node in enumerate(guarded.nodes):
        body = gpu_pod(f"p{i}", 3, SCHED, {"kubernetes.io/hostname": node})
        admin.create_namespaced_pod("alice", body)
    for i, node in enumerate(guarded.nodes):
        assert wait_for(lambda i=i: admin.read_namespaced_pod(f"p{i}", "alice").spec.node_name, timeout=60)
        assert admin.read_namespaced_pod(f"p{i}", "alice").spec.node_name == node
    mark = {"metadata": {"annotations": {GPU_MEM_ASSIGNED: "true", "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1"}}}
    # The plugin's own calls on its own node pass: marking a pod served, publishing the inventory.
    uid0 = admin.read_namespaced_pod("p0", "alice").metadata.uid
    # (through the client the plugin uses, with the same token)
    cfg = plugin.api_client.configuration
    token = cfg.api_key["authorization"].removeprefix("Bearer ")
    rest = RestClient(Access(server=cfg.host, ca_file=cfg.ssl_ca_cert, token=token))
    KubePods(rest).mark_assigned("alice", "p0", uid0)
    assert admin.read_namespaced_pod("p0", "alice").metadata.annotations[GPU_MEM_ASSIGNED] == "true"
    publish_node(rest, "gpu-1", list(declared_cards("gpu-1", 2, "Tesla T4", 15360)), DEFAULT_NAMES)
    # ... and its isolation reports: the MPS labels, usage and MPS servers, a Warning event.
    publish_isolation(rest, "gpu-1", mps=True, multi_user=False)
    sink = KubeUsageSink(rest, "gpu-1")
    sink.annotate_node(
        "gpu-1", {"gpushare-hub.io/usage": '{"pods":[],"cards":{}}', "gpushare-hub.io/mps-servers": "{}"}
    )
    sink.warn_pod("alice", "p0", uid0, "GPU-test", "GPUShareOverSlice", "test")
    publish_isolation(rest, "gpu-1", mps=False, multi_user=False)
    rest.close()
    with pytest.raises(ApiException) as err:
        plugin.patch_namespaced_pod("p1", "alice", mark)  # a pod on gpu-2
    assert err.value.status == 403
    assert "runs on node gpu-1, the pod is on gpu-2" in denial(err.value), denial(err.value)
    with pytest.raises(ApiException) as err:  # its own node's pod, but the extender's record
        plugin.patch_namespaced_pod("p0", "alice", {"metadata": {"annotations": {GPU_MEM_IDX: "1"}}})
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        plugin.patch_node("gpu-2", {"metadata": {"annotations": {CARDS_ANNOTATION: "[]"}}})
    assert err.value.status == 403
    assert "may change only its own Node" in denial(err.value) or "of that node" in denial(err.value)
    with pytest.raises(ApiException) as err:
        plugin.patch_node("gpu-2", {"metadata": {"labels": {"stolen": "yes"}}})
    assert err.value.status == 403 and "runs on node gpu-1, not gpu-2" in denial(err.value)


def _refused(create: Any) -> str:
    """Call ``create``; the refusal's message (403), or '' where the API server accepted it."""
    try:
        create()
    except ApiException as err:
        assert err.status == 403, (err.status, err.body)
        return denial(err)
    return ""


def _with_env(name: str, env: list[dict[str, str]], where: str = "containers", **spec: Any) -> dict[str, Any]:
    body = plain(name, {}, **spec)
    container = {"name": "c", "image": "quay.io/jupyter/base-notebook", "env": env}
    if where == "containers":
        body["spec"]["containers"][0]["env"] = env
    else:
        body["spec"][where] = [container]
    return body


def test_a_pod_may_not_choose_its_card_at_the_container_runtime_outside_the_exempt_namespaces(guarded):
    """NVIDIA_VISIBLE_DEVICES (and NVIDIA_GPU_MEMORY_*, CUDA_MPS_*) on any container, or the NVIDIA
    RuntimeClass, would give the pod cards no ledger counts: refused for a user, naming the container
    and the variable; our own namespace's pods (the plugin's, the MPS daemons') and admins pass."""
    alice = guarded.alice
    visible = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    try:  # the GPU Operator's class (the RuntimeClass admission refuses pods naming a missing one)
        client.NodeV1Api(guarded.cluster.api_client()).create_runtime_class(
            {"metadata": {"name": "nvidia"}, "handler": "nvidia"}
        )
    except ApiException as err:
        assert err.status == 409, err
    # The runtime policy arrives beside the others: wait until it refuses.
    probe = _with_env("probe-env", visible)

    def probed() -> str:
        message = _refused(lambda: alice.create_namespaced_pod("alice", probe))
        if not message:  # not enforced yet: take it away again
            guarded.admin.delete_namespaced_pod("probe-env", "alice", grace_period_seconds=0)
        return message

    assert wait_for(probed, timeout=60), "a user's pod with NVIDIA_VISIBLE_DEVICES was accepted for 60 s"
    cases = [
        (_with_env("env-all", visible), "container notebook sets NVIDIA_VISIBLE_DEVICES"),
        (
            _with_env("mem", [{"name": "NVIDIA_GPU_MEMORY_LIMITS", "value": "99999"}], "initContainers"),
            "init container c sets NVIDIA_GPU_MEMORY_LIMITS",
        ),
        (
            _with_env("mps", [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/x"}]),
            "container notebook sets CUDA_MPS_PIPE_DIRECTORY",
        ),
        (plain("runtime", {}, runtimeClassName="nvidia"), "runtimeClassName nvidia hands a container"),
    ]
    for body, words in cases:
        message = _refused(lambda b=body: alice.create_namespaced_pod("alice", b))
        assert words in message and "pod alice/" in message, message
        assert "gpushare-hub, kube-system, gpu-operator" in message, message
    # A variable of the same family that chooses nothing stays open.
    ok = _with_env("caps", [{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute"}])
    assert _refused(lambda: alice.create_namespaced_pod("alice", ok)) == ""
    # Exempt: our own namespace (the device plugin and the MPS daemons set them), and an admin.
    ours = _with_env("mps-daemon", visible, runtimeClassName="nvidia")
    assert _refused(lambda: alice.create_namespaced_pod(SYSTEM_NS, ours)) == ""
    assert _refused(lambda: guarded.admin.create_namespaced_pod("alice", _with_env("admin", visible))) == ""


def test_a_debug_container_added_to_a_running_pod_may_not_set_them_either(guarded):
    alice = guarded.alice
    alice.create_namespaced_pod("alice", plain("debugged", {}))
    debug = {"name": "dbg", "image": "busybox", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]}

    def add(container: dict[str, Any]) -> Any:
        body = {"spec": {"ephemeralContainers": [container]}}
        return alice.patch_namespaced_pod_ephemeralcontainers("debugged", "alice", body)

    message = wait_for(lambda: _refused(lambda: add(debug)), timeout=60)
    assert "ephemeral container dbg sets NVIDIA_VISIBLE_DEVICES" in message, message
    assert _refused(lambda: add({"name": "plain-dbg", "image": "busybox"})) == ""


def test_the_legacy_bindings_resource_may_not_carry_our_annotations(guarded):
    """POST /api/v1/namespaces/<ns>/bindings binds as pods/binding does and copies the Binding's
    annotations onto the pod: a user's forged allocation is refused there too."""
    alice, admin = guarded.alice, guarded.admin
    alice.create_namespaced_pod("alice", plain("unbound", {}))
    record = AllocationRecord("gpu-1", (CardShare("GPU-sim-gpu-1-0", 0, 15),), ()).to_json()
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "unbound", "annotations": {ALLOCATION_ANNOTATION: record, GPU_MEM_IDX: "0"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-1"},
    }
    message = _refused(lambda: alice.create_namespaced_binding("alice", binding, _preload_content=False))
    assert "written only by the gpushare extender" in message and "alice may not set" in message, message
    pod = admin.read_namespaced_pod("unbound", "alice")
    assert pod.spec.node_name is None and ALLOCATION_ANNOTATION not in (pod.metadata.annotations or {})
    # Without our annotations the same user may still bind (RBAC decides that, not this policy).
    del binding["metadata"]["annotations"]
    assert _refused(lambda: alice.create_namespaced_binding("alice", binding, _preload_content=False)) == ""
    assert admin.read_namespaced_pod("unbound", "alice").spec.node_name == "gpu-1"
