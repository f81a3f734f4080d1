"""Pods on the DRA path in the report: read (spec.resourceClaims, untrusted), kept by the hub
service and shown with their hub user and the units their ResourceClaim holds."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpushare_hub.core import DEFAULT_NAMES, Ledger
from gpushare_hub.core.claims import read_claim
from gpushare_hub.core.errors import InvalidObject
from gpushare_hub.core.names import (
    DRA_POD_CLAIM,
    DRA_TEMPLATE_PREFIX,
    HUB_SERVER_ANNOTATION,
    HUB_USER_ANNOTATION,
    SLICE_ANNOTATION,
)
from gpushare_hub.core.report import report_from_ledger
from gpushare_hub.core.reportfacts import may_hold_slice, pod_facts
from gpushare_hub.core.shapes import MAX_POD_CLAIMS, read_node, read_pod
from gpushare_hub.plugin.hookkeeping import holds_a_slice
from gpushare_hub.service.hubservers import HubServer
from gpushare_hub.service.sources import Cluster, service_informer
from gpushare_hub.service.view import me_document
from tests.support.dra_objects import GIB, allocated, claim, result
from tests.unit.helpers import node_obj, pod_obj

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
NODE = "gpu-1"
UUID0 = "GPU-sim-gpu-1-0"  # card 0 of node_obj(NODE), device gpu-0 of its ResourceSlice


def dra_pod(
    name: str = "jupyter-alice",
    user: str = "alice",
    *,
    ns: str = "jhub",
    node: str | None = None,
    claims: list[dict[str, Any]] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    """A notebook pod as the spawner makes it on the DRA path: no gpu-mem, our pod claim from
    a slice's template, the hub user's annotations."""
    ann = {HUB_USER_ANNOTATION: user, HUB_SERVER_ANNOTATION: "", SLICE_ANNOTATION: "t4-5g"} if user else {}
    pod = pod_obj(name, ns=ns, node=node, uid=f"uid-{name}", annotations=ann, phase=phase)
    default = [{"name": DRA_POD_CLAIM, "resourceClaimTemplateName": f"{DRA_TEMPLATE_PREFIX}t4-5g"}]
    pod["spec"]["resourceClaims"] = default if claims is None else claims
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": DRA_POD_CLAIM}]
    return pod


def reserved(pod: str = "jupyter-alice", gib: int = 5, index: int = 0) -> dict[str, Any]:
    """The pod's claim, allocated ``gib`` of card ``index`` of NODE and reserved for it."""
    made = claim(f"{pod}-gpushare-gpu-x1", uid=f"uid-claim-{pod}")
    return allocated(made, [result(NODE, index, gib * GIB)], [(pod, f"uid-{pod}")])


# ---- reading spec.resourceClaims ---------------------------------------------------------------


def test_a_pods_resource_claims_are_read_and_ours_is_told_from_others():
    pod = read_pod(dra_pod())
    assert [(c.name, c.claim_name, c.template_name) for c in pod.resource_claims] == [
        (DRA_POD_CLAIM, "", f"{DRA_TEMPLATE_PREFIX}t4-5g")
    ]
    assert pod.claims_dra_slice
    by_name = read_pod(dra_pod(claims=[{"name": DRA_POD_CLAIM, "resourceClaimName": "mine"}]))
    assert by_name.claims_dra_slice and by_name.resource_claims[0].claim_name == "mine"
    by_template = read_pod(dra_pod(claims=[{"name": "gpu", "resourceClaimTemplateName": "gpushare-slice-x"}]))
    assert by_template.claims_dra_slice
    other = read_pod(dra_pod(claims=[{"name": "fpga", "resourceClaimTemplateName": "fpga-slice"}]))
    assert not other.claims_dra_slice and other.resource_claims[0].name == "fpga"
    assert not read_pod(pod_obj("plain", 5)).claims_dra_slice


@pytest.mark.parametrize(
    ("claims", "words"),
    [
        ("gpushare-gpu", "spec.resourceClaims: expected a list, got a string"),
        (["gpushare-gpu"], "spec.resourceClaims[0]: expected an object, got a string"),
        ([{"name": 7}], "spec.resourceClaims[0].name: expected a string, got a number"),
        ([{"name": "a", "resourceClaimTemplateName": ["x"]}], "resourceClaimTemplateName: expected a string"),
        ([{"name": "a", "resourceClaimName": "n" * 300}], "resourceClaimName: 300 characters, more than 253"),
        ([{"name": f"c{i}"} for i in range(MAX_POD_CLAIMS + 1)], f"more than {MAX_POD_CLAIMS}"),
    ],
)
def test_a_pods_resource_claims_are_untrusted_and_refused_with_the_field_named(claims, words):
    with pytest.raises(InvalidObject, match=r"^Pod\.spec\.resourceClaims") as err:
        read_pod(dra_pod(claims=claims))
    assert words in str(err.value)


# ---- which pods may hold a slice -----------------------------------------------------------------


async def test_the_pod_the_spawner_makes_on_the_dra_path_is_one_that_may_hold_a_slice():
    from kubernetes_asyncio.client import ApiClient, V1Container, V1ObjectMeta, V1Pod, V1PodSpec

    from gpushare_hub.core.catalogueread import read_catalogue
    from gpushare_hub.spawner.dra import apply_claim

    five = read_catalogue([{"slug": "t4-5g", "display_name": "T4 5 GiB", "gib": 5}]).get("t4-5g")
    assert five is not None
    made = V1Pod(
        metadata=V1ObjectMeta(name="jupyter-alice"), spec=V1PodSpec(containers=[V1Container(name="nb")])
    )
    async with ApiClient() as api:
        pod = read_pod(api.sanitize_for_serialization(apply_claim(made, five)))
    assert pod.claims_dra_slice and may_hold_slice(pod)
    assert pod.resource_claims[0].template_name == f"{DRA_TEMPLATE_PREFIX}t4-5g"


def test_a_dra_pod_may_hold_a_slice_and_its_plugin_keeps_the_hook_for_it_until_it_ends():
    assert may_hold_slice(read_pod(dra_pod()))
    assert not may_hold_slice(read_pod(dra_pod(claims=[{"name": "fpga", "resourceClaimName": "f"}])))
    assert not may_hold_slice(read_pod(pod_obj("cpu-only")))
    assert holds_a_slice(read_pod(dra_pod(node=NODE)), DEFAULT_NAMES)
    assert not holds_a_slice(read_pod(dra_pod(node=NODE, phase="Succeeded")), DEFAULT_NAMES)


def test_a_dra_pods_facts_name_its_hub_user_and_it_waits_for_the_default_scheduler_not_ours():
    waiting = dra_pod()
    waiting["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "message": "cannot allocate all claims"}
    ]
    facts = pod_facts(read_pod(waiting))
    assert facts is not None and facts.row is not None and not facts.warning
    assert (facts.row.hub_user, facts.row.slice, facts.row.units) == ("alice", "t4-5g", 0)
    assert facts.row.reason == "cannot allocate all claims"
    assert facts.pending is None  # no Demand of ours: our queue and estimates leave it out
    # A DRA pod outside the hub's namespaces is no spawn of the hub's (its claim still counts).
    assert pod_facts(read_pod(dra_pod(ns="team-x")), hub_namespaces={"jhub"}) is None
    assert pod_facts(read_pod(dra_pod(phase="Failed"))) is None
    assert pod_facts(read_pod(dra_pod(claims=[{"name": "fpga", "resourceClaimName": "f"}]))) is None
    # A pod of the device-plugin path is read as before, Demand and all.
    plain = pod_facts(read_pod(pod_obj("jupyter-bob", 7)))
    assert plain.row.units == 7 and plain.pending is not None and plain.pending.demand.per_card == 7


def test_only_the_hubs_dra_spawns_wait_on_the_dashboard():
    # A pod anywhere, with a claim named like ours and no GPU request, waits for no slice of ours.
    hub = {"jhub"}
    for pod in (
        dra_pod(ns="team-x"),  # our template's name, another namespace
        dra_pod(claims=[{"name": DRA_POD_CLAIM, "resourceClaimName": "anything"}]),  # not a template
        dra_pod(claims=[{"name": DRA_POD_CLAIM, "resourceClaimTemplateName": "fpga"}]),  # another template
    ):
        assert pod_facts(read_pod(pod), hub_namespaces=hub) is None, pod["spec"]["resourceClaims"]
    cluster = Cluster(lambda: service_informer(None, DEFAULT_NAMES), DEFAULT_NAMES, 30.0, hub)
    informer = cluster._subscribed()
    informer.apply("nodes", "ADDED", node_obj(NODE))
    informer.apply("pods", "ADDED", dra_pod("jupyter-x", ns="team-x"))
    informer.apply(
        "pods", "ADDED", dra_pod("fake", claims=[{"name": DRA_POD_CLAIM, "resourceClaimName": "c"}])
    )
    assert cluster.report().pending == ()
    # The hub's own spawn, from our template in its namespace, waits.
    informer.apply("pods", "ADDED", dra_pod())
    assert [p.name for p in cluster.report().pending] == ["jupyter-alice"]
    # kubectl inspect gpushare (no hub namespaces: believes every namespace) still asks our template.
    assert pod_facts(read_pod(dra_pod(ns="team-x"))) is not None
    assert pod_facts(read_pod(dra_pod(claims=[{"name": DRA_POD_CLAIM, "resourceClaimName": "c"}]))) is None


# ---- the report ----------------------------------------------------------------------------------


def dra_report(*claims: dict[str, Any], pods: tuple[dict[str, Any], ...] = ()) -> Any:
    ledger = Ledger()
    ledger.observe_node(read_node(node_obj(NODE)))
    for c in claims:
        ledger.observe_claim(read_claim(c))
    facts = [f for p in pods if (f := pod_facts(read_pod(p))) is not None]
    return report_from_ledger(ledger, [], facts)


def test_a_dra_pod_shows_on_its_card_with_its_hub_user_and_the_units_its_claim_holds():
    report = dra_report(reserved(gib=5), pods=(dra_pod(node=NODE),))
    card = next(c for c in report.nodes[0].cards if c.uuid == UUID0)
    rows = [(p.name, p.hub_user, p.units, p.slice) for p in card.pods]
    assert rows == [("jupyter-alice", "alice", 5, "t4-5g")]
    assert card.used == 5 and report.nodes[0].unplaced == ()
    # The claim's size, not the pod's, is what it holds.
    bigger = dra_report(reserved(gib=7), pods=(dra_pod(node=NODE),))
    assert bigger.nodes[0].cards[0].pods[0].units == 7
    # The status bar's api/v1/me gives alice her slice.
    servers = [HubServer("alice", "", "2026-11-22T11:00:00Z", "2026-11-22T11:50:00Z")]
    mine = me_document(report, servers, "alice", NOW, 1800, None, "")["allocations"]
    assert [(a["pod"], a["units"], a["node"]) for a in mine] == [("jupyter-alice", 5, NODE)]
    assert me_document(report, servers, "bob", NOW, 1800, None, "")["allocations"] == []


def test_without_the_dra_pods_facts_its_claim_shows_on_the_card_with_no_hub_user():
    report = dra_report(reserved(gib=5))
    rows = [(p.name, p.hub_user, p.units) for p in report.nodes[0].cards[0].pods]
    assert rows == [("jupyter-alice", "", 5)]


# ---- the hub service follows claim events --------------------------------------------------------


def fed_cluster() -> tuple[Cluster, Any]:
    cluster = Cluster(lambda: service_informer(None, DEFAULT_NAMES), DEFAULT_NAMES, 30.0, {"jhub"})
    informer = cluster._subscribed()  # what SharedLedger starts
    informer.apply("nodes", "ADDED", node_obj(NODE))
    informer.apply("pods", "ADDED", dra_pod(node=NODE))
    return cluster, informer


def held(cluster: Cluster) -> list[tuple[str, str, int]]:
    return [(p.name, p.hub_user, p.units) for n in cluster.report().nodes for c in n.cards for p in c.pods]


def test_the_services_report_and_me_cache_follow_claim_events():
    cluster, informer = fed_cluster()
    assert "jhub/jupyter-alice" in cluster.pods and cluster.pending() == {}
    before = cluster.report()
    assert held(cluster) == [] and [p.name for p in before.nodes[0].unplaced] == ["jupyter-alice"]
    made: list[int] = []

    def make() -> int:
        made.append(1)
        return len(made)

    assert cluster.recent("me", make) == 1

    informer.apply("resourceclaims", "ADDED", reserved(gib=5))
    assert cluster.recent("me", make) == 2  # not the cached one
    assert cluster.report() is not before
    assert held(cluster) == [("jupyter-alice", "alice", 5)] and cluster.report().nodes[0].unplaced == ()

    informer.apply("resourceclaims", "DELETED", reserved(gib=5))
    assert held(cluster) == []


def test_a_claim_event_that_changes_nothing_counted_still_rebuilds_only_once():
    cluster, informer = fed_cluster()
    informer.apply("resourceclaims", "ADDED", reserved(gib=5))
    report = cluster.report()
    assert cluster.report() is report  # no event since: the same report
    other = claim("not-ours", ns="team-x")
    informer.apply("resourceclaims", "ADDED", other)  # unallocated: holds nothing
    assert cluster.report() is not report and cluster.report() == report


def test_claims_of_other_drivers_and_classes_change_nothing_the_service_caches():
    cluster, informer = fed_cluster()
    informer.apply("resourceclaims", "ADDED", reserved(gib=5))
    report = cluster.report()
    cached = cluster.recent("me", lambda: object())
    unrelated = [
        claim("other-class", ns="team-x", device_class="gpu.nvidia.com"),
        allocated(
            claim("other-driver", ns="team-x", device_class="gpu.nvidia.com"),
            [result(NODE, 0, None, driver="gpu.nvidia.com")],
            [("p", "u")],
        ),
    ]
    for obj in unrelated:
        for etype in ("ADDED", "MODIFIED", "DELETED"):
            informer.apply("resourceclaims", etype, obj)
    assert cluster.report() is report
    assert cluster.recent("me", lambda: object()) is cached
