"""The admission policies against the real API server: forgeries refused, the plugin as narrow as a kubelet.

These tests run their own control plane: the policies bind cluster-wide, and the
session cluster's other tests (and the kubelet tier's plugin, which has no
node-bound token) write annotations as the admin or a plain client certificate.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpushare_hub.core import AllocationRecord, CardShare
from gpushare_hub.core.cards import declared_cards
from gpushare_hub.core.names import ALLOCATION_ANNOTATION, CARDS_ANNOTATION, GPU_MEM_ASSIGNED, GPU_MEM_IDX
from gpushare_hub.core.resources import DEFAULT_NAMES
from gpushare_hub.extender.admission import Identities, admission_manifests
from gpushare_hub.extender.rbac import cluster_role, cluster_role_binding
from gpushare_hub.kube.kubeconfig import Access
from gpushare_hub.kube.rest import RestClient
from gpushare_hub.localcluster.cluster import LocalCluster
from gpushare_hub.plugin.kube import RBAC_RULES as PLUGIN_RULES
from gpushare_hub.plugin.kube import KubePods, KubeUsageSink, publish_isolation, publish_node
from tests.conftest import gpu_pod, running_cluster, wait_for

SCHED = "gpushare-scheduler"
SYSTEM_NS = "gpushare-hub"
PLUGIN_SA = "gpushare-device-plugin"
PLUGIN_USER = f"system:serviceaccount:{SYSTEM_NS}:{PLUGIN_SA}"
USER_RULES = [
    {
        "apiGroups": [""],
        "resources": ["pods"],
        "verbs": ["get", "list", "create", "patch", "update", "delete"],
    },
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
]


class Guarded:
    """A control plane with the policies installed, the extender, and a user and a plugin identity."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.admin = cluster.core_api()
        self.ext, _ = cluster.start_gpushare_scheduler()
        self.nodes = cluster.add_gpu_nodes(2, cards=2)
        self.admin.create_namespace({"metadata": {"name": SYSTEM_NS}})
        self.admin.create_namespace({"metadata": {"name": "alice"}})
        self.admin.create_namespaced_service_account(SYSTEM_NS, {"metadata": {"name": PLUGIN_SA}})
        rbac = client.RbacAuthorizationV1Api(cluster.api_client())
        rbac.create_cluster_role(cluster_role("gpushare-device-plugin", PLUGIN_RULES))
        rbac.create_cluster_role_binding(
            cluster_role_binding(
                {"kind": "ServiceAccount", "name": PLUGIN_SA, "namespace": SYSTEM_NS},
                "gpushare-device-plugin",
            )
        )
        cluster.grant("alice", USER_RULES)  # a notebook user who may write pods, and (say) patch nodes
        self.alice = cluster.core_api(cluster.credential("alice", "alice"))
        ids = Identities(extender=("gpushare-extender",), plugin=(PLUGIN_USER,), policy_setters=("the-hub",))
        cluster.grant("the-hub", USER_RULES)
        self.hub = cluster.core_api(cluster.credential("the-hub", "the-hub"))
        admission = client.AdmissionregistrationV1Api(cluster.api_client())
        for doc in admission_manifests(ids):
            if doc["kind"] == "ValidatingAdmissionPolicy":
                admission.create_validating_admission_policy(doc)
            else:
                admission.create_validating_admission_policy_binding(doc)
        # The API server enforces a new policy once its informer has it: wait for the first refusal,
        # of a pod's annotation and of a Node's (the policies on Pods and on Nodes arrive apart; a
        # forged inventory let through would also break the extender's placements on that node).
        probe = plain("probe", {GPU_MEM_IDX: "0"})
        assert wait_for(lambda: self._refused_now(probe), timeout=60), "the Pods' policy is not enforced"
        assert wait_for(self._node_patch_refused_now, timeout=60), "the Nodes' policy is not enforced"

    def _refused_now(self, body: dict[str, Any]) -> bool:
        try:
            self.alice.create_namespaced_pod("alice", body)
        except ApiException as err:
            return err.status == 403
        self.alice.delete_namespaced_pod(body["metadata"]["name"], "alice", grace_period_seconds=0)
        return False

    def _node_patch_refused_now(self) -> bool:
        """alice sets a Node annotation only the plugin may write: refused once the policy is
        enforced; before, the admin takes it off again."""
        key = "gpushare-hub.io/mps-servers"
        try:
            self.alice.patch_node(self.nodes[0], {"metadata": {"annotations": {key: "{}"}}})
        except ApiException as err:
            return err.status == 403
        self.admin.patch_node(self.nodes[0], {"metadata": {"annotations": {key: None}}})
        return False

    def plugin_api(self, node: str) -> tuple[client.CoreV1Api, dict[str, Any]]:
        """The plugin's API as its DaemonSet pod on ``node`` would have it: a token bound to that pod."""
        name = f"dp-{node}"
        pod = {
            "metadata": {"name": name, "namespace": SYSTEM_NS},
            "spec": {
                "nodeName": node,
                "serviceAccountName": PLUGIN_SA,
                "containers": [{"name": "plugin", "image": "gpushare-hub/device-plugin"}],
            },
        }
        created = self.admin.create_namespaced_pod(SYSTEM_NS, pod)
        token = self.admin.create_namespaced_service_account_token(
            PLUGIN_SA,
            SYSTEM_NS,
            {
                "spec": {
                    "boundObjectRef": {
                        "kind": "Pod",
                        "apiVersion": "v1",
                        "name": name,
                        "uid": created.metadata.uid,
                    },
                    "expirationSeconds": 3600,
                }
            },
        ).status.token
        cfg = client.Configuration()
        cfg.host = self.cluster.server
        cfg.ssl_ca_cert = str(Path(self.cluster.workdir) / "pki" / "ca.crt")
        cfg.api_key = {"authorization": f"Bearer {token}"}
        api_client = client.ApiClient(cfg)
        review = client.AuthenticationV1Api(api_client).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        return client.CoreV1Api(api_client), review.status.user_info.to_dict()


def plain(name: str, annotations: dict[str, str], units: int = 1, **spec: Any) -> dict[str, Any]:
    body = gpu_pod(name, units, "nobody-schedules-this", **spec)
    body["metadata"]["annotations"] = annotations
    return body


def denial(err: ApiException) -> str:
    try:
        return str(json.loads(err.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(err.body)


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
