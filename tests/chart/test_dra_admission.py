"""The chart's DRA admission policies on a real API server: a claim of our class asks one of the
catalogue's sizes (as a quantity), and only the DRA plugin writes our driver's ResourceSlices.

Consumable capacity is on by default from Kubernetes 1.36; the local cluster switches it on at
the older pinned version too (localcluster/controlplane.py's DRA_GATES), so these run at every version,
the chart rendered as for 1.36 there (it refuses older clusters, whose admins would have to switch
the gate on themselves).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare_hub.core.names import DRA_DRIVER
from gpushare_hub.kube.kubeconfig import Access
from gpushare_hub.kube.rest import ApiStatusError, RestClient
from gpushare_hub.localcluster.cluster import LocalCluster
from tests.conftest import wait_for
from tests.support.admission import node_bound_token
from tests.support.dra_admission import (
    NS,
    claim,
    create,
    dra_policies_cluster,
    kubectl,
    refused_eventually,
    template_of,
)

from .conftest import CHART, Helm

SYSTEM_NS = "gpushare-hub"
DRA_PLUGIN = f"system:serviceaccount:{SYSTEM_NS}:gpushare-dra-plugin"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


@pytest.fixture(scope="module")
def cluster(helm: Helm) -> Iterator[tuple[LocalCluster, Path]]:
    with dra_policies_cluster(helm, CHART) as made:
        yield made


def test_a_size_the_catalogue_does_not_offer_is_refused_naming_claim_size_and_sizes(cluster):
    c, _ = cluster
    err = refused_eventually(c, claim("asks-4g", "4Gi"))
    assert f"ResourceClaim {NS}/asks-4g" in err and "request gpu asks 4Gi" in err, err
    assert "3Gi, 5Gi, 7Gi" in err, err


@pytest.mark.parametrize("memory", ["5Gi", "5368709120"])
def test_a_catalogue_size_is_accepted_in_any_spelling(cluster, memory):
    c, _ = cluster
    refused_eventually(c, claim("warm-up", "4Gi"))
    name = f"asks-{memory.lower()}"
    proc = create(c, claim(name, memory))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("memory", "count", "words"), [(None, 1, "asks no memory"), ("5Gi", 2, "asks count 2")]
)
def test_no_size_or_more_than_one_device_is_refused(cluster, memory, count, words):
    c, _ = cluster
    err = refused_eventually(c, claim(f"bad-{count}-{memory}".lower(), memory, count))
    assert words in err, err


def test_a_template_asking_a_wrong_size_is_refused_too(cluster):
    c, _ = cluster
    err = refused_eventually(c, template_of(claim("t-4g", "4Gi")))
    assert f"ResourceClaimTemplate {NS}/t-4g" in err and "4Gi" in err, err


def slice_of(node: str, pool: str = "", **spec: Any) -> dict[str, Any]:
    """Our driver's slice for ``node`` (``pool``: its pool's name, the node's by default); ``spec``
    replaces fields (nodeName=None leaves it out)."""
    body = {
        "driver": DRA_DRIVER,
        "nodeName": node,
        "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
        "devices": [],
        **spec,
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"gpushare-hub-{node}-{pool or node}"},
        "spec": {k: v for k, v in body.items() if v is not None},
    }


def test_only_the_dra_plugin_writes_our_slices(cluster):
    c, _ = cluster
    rules = [
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["create", "delete"]}
    ]
    for user in ("alice", "system:serviceaccount:gpushare-hub:gpushare-dra-plugin"):
        c.grant(user, rules)
    alice = c.credential("alice", "alice")
    err = refused_eventually(c, slice_of("gpu-1"), kubeconfig=alice)
    assert "written only by the gpushare DRA plugin of their node" in err and "alice" in err, err
    # The plugin's identity without a node-bound token (a client certificate has none) is refused.
    plugin = c.credential("dra", "system:serviceaccount:gpushare-hub:gpushare-dra-plugin")
    proc = create(c, slice_of("gpu-1"), kubeconfig=plugin)
    assert proc.returncode != 0 and "has no node name in its token" in proc.stderr, proc.stderr
    # An admin may repair it.
    assert create(c, slice_of("gpu-1")).returncode == 0


def test_the_plugin_names_its_own_node_as_its_slices_pool_and_no_slice_of_ours_spans_nodes(cluster):
    """The ledger reads a slice's pool as its node: a plugin that publishes for its own node but
    under another node's pool would put its cards on that node's books. A plugin with a token bound
    to its pod on gpu-7 is refused pool gpu-8; nobody, an admin included, writes a slice of our
    driver that is for all nodes or a node selector. (Per-device node selection is refused by the
    same rule; the API server drops it without DRAPartitionableDevices, so it is not shown here.)"""
    c, _ = cluster
    c.add_gpu_nodes(1, cards=1, start=7, wait=False)  # a token is bound only to a pod on a real Node
    c.core_api().create_namespace({"metadata": {"name": SYSTEM_NS}})
    c.core_api().create_namespaced_service_account(SYSTEM_NS, {"metadata": {"name": "gpushare-dra-plugin"}})
    c.grant(
        DRA_PLUGIN, [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["create"]}]
    )
    token = node_bound_token(c.core_api(), SYSTEM_NS, "gpushare-dra-plugin", "gpu-7")
    ca = str(Path(c.workdir) / "pki" / "ca.crt")
    bad = slice_of("gpu-7", pool="gpu-8")

    with RestClient(Access(server=c.server, ca_file=ca, token=token)) as plugin:

        def attempt() -> ApiStatusError | None:
            try:
                plugin.post(SLICES, bad)
            except ApiStatusError as err:
                return err
            kubectl(c, "delete", "resourceslice", bad["metadata"]["name"])
            return None

        refused = wait_for(attempt, timeout=60, every=0.5)
        assert refused is not None and refused.status == 403, "the plugin published under another pool"
        words = "runs on node gpu-7, the slice gpushare-hub-gpu-7-gpu-8 is for node gpu-7 in pool gpu-8"
        assert words in str(refused), refused
        plugin.post(SLICES, slice_of("gpu-7"))  # its own node, its own pool
    spans = [
        (
            slice_of("all", nodeName=None, allNodes=True),
            "no spec.nodeName, spec.pool.name all is not its node, spec.allNodes",
        ),
        (
            slice_of("sel", nodeName=None, nodeSelector={"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "gpu", "operator": "Exists"}]}]}),
            "spec.nodeSelector",
        ),
        (slice_of("gpu-7", pool="gpu-9"), "spec.pool.name gpu-9 is not its node"),
    ]  # fmt: skip
    for body, words in spans:
        err = refused_eventually(c, body)  # as the admin
        assert words in err and "is for one node, named in spec.nodeName and spec.pool.name alike" in err, err
