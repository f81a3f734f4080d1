"""The admission policies' control plane for the cluster tier (tests/cluster/test_admission.py):
the policies installed, the extender, a notebook user, the hub, and the device plugin's identity
with a service-account token bound to its pod on a node, as its DaemonSet pod would have it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpushare_hub.core.names import GPU_MEM_IDX
from gpushare_hub.extender.admission import Identities, admission_manifests
from gpushare_hub.extender.rbac import cluster_role, cluster_role_binding
from gpushare_hub.localcluster.cluster import LocalCluster
from gpushare_hub.plugin.kube import RBAC_RULES as PLUGIN_RULES
from tests.conftest import gpu_pod, wait_for

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
    # What a user given more than the hub's users get might also hold: debug containers, and the
    # legacy namespaced Binding (POST .../namespaces/<ns>/bindings), whose annotations land on the pod.
    {"apiGroups": [""], "resources": ["pods/ephemeralcontainers"], "verbs": ["patch", "update"]},
    {"apiGroups": [""], "resources": ["bindings", "pods/binding"], "verbs": ["create"]},
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
        token = node_bound_token(self.admin, SYSTEM_NS, PLUGIN_SA, node)
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


def node_bound_token(admin: client.CoreV1Api, namespace: str, service_account: str, node: str) -> str:
    """A token of ``service_account`` bound to a pod of it on ``node`` (made here), as a DaemonSet
    pod's projected token is: the API server puts the node's name in the token's user info."""
    name = f"{service_account}-{node}"[:63]
    pod = {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeName": node,
            "serviceAccountName": service_account,
            "containers": [{"name": "plugin", "image": "gpushare-hub/device-plugin"}],
        },
    }
    created = admin.create_namespaced_pod(namespace, pod)
    ref = {"kind": "Pod", "apiVersion": "v1", "name": name, "uid": created.metadata.uid}
    return str(
        admin.create_namespaced_service_account_token(
            service_account, namespace, {"spec": {"boundObjectRef": ref, "expirationSeconds": 3600}}
        ).status.token
    )
