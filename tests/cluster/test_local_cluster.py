"""The local cluster is real: the upstream scheduler binds, kwok runs pods, RBAC denies."""

from __future__ import annotations

import os
import time

import pytest
from kubernetes.client.exceptions import ApiException

from gpushare_hub.localcluster import build
from gpushare_hub.localcluster.cluster import LocalCluster
from gpushare_hub.localcluster.processes import HarnessError
from tests.conftest import gpu_pod, wait_for


def test_components_report_the_pinned_versions(local_cluster):
    pinned = build.Versions.load()
    assert local_cluster.version()["gitVersion"] == pinned.kubernetes


def test_gpu_nodes_carry_the_extended_resource_and_inventory(local_cluster):
    node = local_cluster.core_api().read_node("gpu-1")
    assert node.status.allocatable["aliyun.com/gpu-mem"] == "30"
    assert node.metadata.labels["gpushare"] == "true"
    assert "GPU-sim-gpu-1-0" in node.metadata.annotations["gpushare-hub.io/cards"]


def test_pod_bound_by_the_real_scheduler_becomes_running(local_cluster, namespace):
    api = local_cluster.core_api()
    api.create_namespaced_pod(namespace, gpu_pod("notebook", 3))

    def running():
        pod = api.read_namespaced_pod("notebook", namespace)
        return pod if pod.status.phase == "Running" else None

    pod = wait_for(running)
    assert pod, "pod never became Running"
    node = api.read_node(pod.spec.node_name)  # a real Node object of the cluster, run by kwok
    assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
    assert pod.status.pod_ip


def test_pod_asking_more_than_any_node_has_stays_pending_with_the_schedulers_reason(local_cluster, namespace):
    api = local_cluster.core_api()
    api.create_namespaced_pod(namespace, gpu_pod("too-big", 100_000))

    def unschedulable():
        pod = api.read_namespaced_pod("too-big", namespace)
        conds = [
            c for c in pod.status.conditions or [] if c.type == "PodScheduled" and c.reason == "Unschedulable"
        ]
        return conds[0] if conds else None

    cond = wait_for(unschedulable)
    assert cond, "the scheduler never reported the pod unschedulable"
    assert "Insufficient aliyun.com/gpu-mem" in cond.message
    assert api.read_namespaced_pod("too-big", namespace).status.phase == "Pending"


def test_a_service_account_without_rights_is_denied_and_a_bound_one_allowed(local_cluster, namespace):
    from kubernetes import client

    api = local_cluster.api_client()
    authz = client.AuthorizationV1Api(api)

    def allowed(sa: str) -> bool:
        review = authz.create_subject_access_review(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": f"system:serviceaccount:{namespace}:{sa}",
                    "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                    "resourceAttributes": {
                        "namespace": namespace,
                        "verb": "create",
                        "resource": "pods",
                        "subresource": "binding",
                    },
                },
            }
        )
        return bool(review.status.allowed)

    assert not allowed("nobody")
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "binder"},
            "rules": [{"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "binder"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "binder"},
            "subjects": [{"kind": "ServiceAccount", "name": "extender", "namespace": namespace}],
        },
    )
    assert wait_for(lambda: allowed("extender"), timeout=60)
    assert not allowed("nobody")


def test_an_unprivileged_user_is_really_refused_by_the_api_server(local_cluster, namespace):
    kubeconfig = local_cluster.credential("stranger", "stranger")
    with pytest.raises(ApiException) as err:
        local_cluster.core_api(kubeconfig).list_namespaced_pod(namespace)
    assert err.value.status == 403


def test_a_second_scheduler_only_takes_pods_that_name_it(local_cluster, namespace):
    local_cluster.start_scheduler("second-scheduler")
    api = local_cluster.core_api()
    api.create_namespaced_pod(namespace, gpu_pod("mine", 1, scheduler="second-scheduler"))
    api.create_namespaced_pod(namespace, gpu_pod("orphan", 1, scheduler="nobody-runs-this"))
    assert wait_for(lambda: api.read_namespaced_pod("mine", namespace).spec.node_name)
    time.sleep(1)
    assert api.read_namespaced_pod("orphan", namespace).spec.node_name is None


def test_teardown_leaves_no_process_behind():
    with LocalCluster() as cluster:
        cluster.start()
        cluster.start_scheduler()
        pids = [c.pid for c in cluster.components.values()]
        workdir = cluster.workdir
        assert all(os.path.exists(f"/proc/{p}") for p in pids)
    assert wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in pids), timeout=60)
    assert not workdir.exists()


def test_a_failed_start_names_the_component_and_its_log(tmp_path):
    bins = tmp_path / "bin"
    bins.mkdir()
    real = build.bin_dir()
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"):
        (bins / name).symlink_to(real / name)
    (bins / "etcd").write_text("#!/bin/sh\necho 'etcd: cannot bind' >&2\nexit 3\n")
    (bins / "etcd").chmod(0o755)
    with (
        pytest.raises(HarnessError, match=r"(?s)etcd exited \(code 3\).*etcd.log.*cannot bind"),
        LocalCluster(workdir=tmp_path / "work", bin_dir=bins) as cluster,
    ):
        cluster.start()
