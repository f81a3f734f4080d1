"""Isolation tiers: what a node claims and its check, what a slice or pod requires, and the placer
using only nodes that enforce the required tier, with reasons a user can act on."""

from __future__ import annotations

import json

import pytest

from gpushare_hub.core import Demand, Ledger, Placement, Placer, Refusal, demand_from_pod
from gpushare_hub.core.cards import node_from_k8s
from gpushare_hub.core.catalogue import CatalogueError
from gpushare_hub.core.catalogueread import read_catalogue
from gpushare_hub.core.errors import InvalidObject
from gpushare_hub.core.isolation import Check, NodeIsolation, read_node_isolation, satisfies
from gpushare_hub.core.names import ISOLATION_ANNOTATION, ISOLATION_CHECK_ANNOTATION
from gpushare_hub.core.verdict import Kind, Reason, explain
from tests.objects import read_node, read_pod

from .helpers import node_obj, pod_obj


def tiered(name: str, tier: str | None, check: dict | None = None, cards: int = 1) -> dict:
    obj = node_obj(name, cards=cards)
    if tier is not None:
        obj["metadata"]["annotations"][ISOLATION_ANNOTATION] = tier
    if check is not None:
        obj["metadata"]["annotations"][ISOLATION_CHECK_ANNOTATION] = json.dumps(check)
    return obj


def ledger_of(*objs: dict) -> Ledger:
    ledger = Ledger()
    for obj in objs:
        node = node_from_k8s(read_node(obj))
        assert node is not None
        ledger.set_node(node)
    return ledger


def test_a_node_without_the_annotation_is_cooperative_and_every_node_satisfies_no_requirement():
    node = node_from_k8s(read_node(node_obj("gpu-1")))
    assert node is not None
    assert node.isolation.effective == "cooperative"
    assert satisfies("cooperative", None) and satisfies("cooperative", "cooperative")
    assert not satisfies("cooperative", "mps") and satisfies("mps", "mps") and not satisfies("driver", "mps")


def test_a_node_annotation_that_is_no_tier_is_ignored_with_a_message_naming_it():
    iso = read_node_isolation("gpu-1", {ISOLATION_ANNOTATION: "titanium"}, ISOLATION_ANNOTATION, "x")
    assert iso.effective == "cooperative"
    assert (
        "gpu-1" in iso.problem and "'titanium'" in iso.problem and "cooperative, mps, driver" in iso.problem
    )


def test_a_failed_check_makes_the_node_count_as_the_tier_it_observed():
    failed = NodeIsolation("mps", Check("cooperative", False, "mps", "2026-11-25T10:00:00Z"))
    assert failed.effective == "cooperative" and failed.words == "cooperative limit for the whole server"
    assert NodeIsolation("mps", Check("mps", True)).effective == "mps"
    assert NodeIsolation("driver", Check("none", False)).effective == "cooperative"
    node = node_from_k8s(read_node(tiered("gpu-1", "mps", {"observed": "cooperative", "ok": False})))
    assert node is not None and node.isolation.claimed == "mps" and node.isolation.effective == "cooperative"


@pytest.mark.parametrize(
    "check",
    [
        "not json",
        json.dumps([1]),
        json.dumps({"observed": "steel", "ok": True}),
        json.dumps({"observed": "mps"}),
    ],
)
def test_an_unreadable_check_does_not_let_the_claim_stand(check):
    annotations = {ISOLATION_ANNOTATION: "mps", ISOLATION_CHECK_ANNOTATION: check}
    iso = read_node_isolation("gpu-1", annotations, ISOLATION_ANNOTATION, ISOLATION_CHECK_ANNOTATION)
    assert iso.effective == "cooperative"
    assert ISOLATION_CHECK_ANNOTATION in iso.problem


def test_the_catalogue_takes_a_tier_and_refuses_an_unknown_one_naming_it():
    catalogue = read_catalogue(
        [
            {"slug": "t4-5g", "display_name": "T4 5", "gib": 5},
            {"slug": "t4-5g-hard", "display_name": "T4 5 hard", "gib": 5, "isolation": "mps"},
        ]
    )
    soft, hard = catalogue.slices
    assert soft.isolation is None and soft.limit_words == "cooperative limit for the whole server"
    assert hard.isolation == "mps" and hard.limit_words == "hard limit per process by MPS"
    assert hard.demand().isolation == "mps"
    with pytest.raises(CatalogueError, match=r"slug 'x'.*'isolation' is 'hardest'.*cooperative, mps, driver"):
        read_catalogue([{"slug": "x", "display_name": "X", "gib": 5, "isolation": "hardest"}])


def test_a_pods_required_tier_is_read_and_a_wrong_one_refused_naming_the_annotation():
    pod = pod_obj("nb", 5, annotations={ISOLATION_ANNOTATION: "mps"})
    demand = demand_from_pod(read_pod(pod))
    assert demand is not None and demand.isolation == "mps"
    with pytest.raises(InvalidObject, match=r"jhub/nb: annotation gpushare-hub.io/isolation is 'steel'"):
        demand_from_pod(read_pod(pod_obj("nb", 5, annotations={ISOLATION_ANNOTATION: "steel"})))


def test_a_slice_requiring_mps_goes_only_to_the_mps_node():
    ledger = ledger_of(tiered("gpu-coop", None, cards=2), tiered("gpu-mps", "mps"))
    placer = Placer(ledger, "binpack")
    got = placer.place_and_commit(Demand(key="jhub/a", per_card=5, count=1, isolation="mps"))
    assert isinstance(got, Placement) and got.node == "gpu-mps"
    v = placer.verdict("gpu-coop", Demand(key="jhub/b", per_card=5, count=1, isolation="mps"))
    assert v.kind is Kind.NEVER and v.reason is Reason.ISOLATION
    text = explain(v, Demand(key="jhub/b", per_card=5, count=1, isolation="mps"), ledger.names)
    assert text == (
        "node gpu-coop enforces cooperative isolation (cooperative limit for the whole server), "
        "the pod requires mps (hard limit per process by MPS)"
    )
    # Without the requirement, binpack still fills the card it started on.
    plain = placer.place_and_commit(Demand(key="jhub/c", per_card=5, count=1))
    assert isinstance(plain, Placement) and plain.node == "gpu-mps"


def test_when_the_mps_node_is_full_the_pod_waits_and_is_told_why():
    ledger = ledger_of(tiered("gpu-coop", None, cards=2), tiered("gpu-mps", "mps"))
    placer = Placer(ledger, "binpack")
    for i in range(3):
        assert isinstance(
            placer.place_and_commit(Demand(key=f"jhub/a{i}", per_card=5, count=1, isolation="mps")), Placement
        )
    refused = placer.decide(Demand(key="jhub/late", per_card=5, count=1, isolation="mps"))
    assert isinstance(refused, Refusal) and not refused.permanent
    assert "no card on a node with mps isolation has 5 GiB free" in refused.reason
    assert "gpu-mps" in refused.reason and "waits" in refused.reason


def test_with_no_mps_node_at_all_the_refusal_is_permanent_and_says_what_to_change():
    ledger = ledger_of(tiered("gpu-1", None), tiered("gpu-2", "driver"))
    refused = Placer(ledger, "binpack").decide(Demand(key="jhub/x", per_card=5, count=1, isolation="mps"))
    assert isinstance(refused, Refusal) and refused.permanent
    assert refused.reason == (
        "pod jhub/x asks 5 GiB on one card with a hard limit per process by MPS, but no node enforces mps "
        "isolation (the nodes enforce cooperative, driver); choose a slice without this requirement, or "
        "enable mps on a GPU node"
    )


def test_a_node_whose_check_failed_takes_no_slice_that_requires_its_claimed_tier():
    ledger = ledger_of(tiered("gpu-1", "mps", {"observed": "cooperative", "ok": False}))
    refused = Placer(ledger, "binpack").decide(Demand(key="jhub/x", per_card=5, count=1, isolation="mps"))
    assert isinstance(refused, Refusal) and refused.permanent and "no node enforces mps" in refused.reason


def test_a_check_of_an_earlier_claim_does_not_count():
    annotations = {
        ISOLATION_ANNOTATION: "driver",
        ISOLATION_CHECK_ANNOTATION: json.dumps({"claimed": "mps", "observed": "cooperative", "ok": False}),
    }
    iso = read_node_isolation("gpu-1", annotations, ISOLATION_ANNOTATION, ISOLATION_CHECK_ANNOTATION)
    assert iso.check is None and iso.effective == "driver"


def test_the_form_counts_only_nodes_with_the_tier_and_says_when_there_is_none():
    from gpushare_hub.core.availability import availability, render

    ledger = ledger_of(tiered("gpu-coop", None, cards=2), tiered("gpu-mps", "mps"))
    hard = Demand(key="slice/hard", per_card=5, count=1, isolation="mps")
    assert render(availability(ledger, hard)) == "3 free"  # one MPS card: 3 slices, not 9
    assert render(availability(ledger, Demand(key="slice/soft", per_card=5, count=1))) == "9 free"
    driver = Demand(key="slice/driver", per_card=5, count=1, isolation="driver")
    a = availability(ledger, driver)
    assert a.permanent
    assert render(a) == "unavailable: no GPU card here is on a node with a hard limit by the driver"


def test_a_running_pods_owner_rewriting_its_tier_to_nonsense_does_not_free_its_card():
    """The tier matters only when placing: a record stays counted whatever the owner writes later."""
    ledger = ledger_of(tiered("gpu-mps", "mps"))
    placed = Placer(ledger, "binpack").place_and_commit(
        Demand(key="jhub/a", uid="uid-a", per_card=5, count=1, isolation="mps")
    )
    assert isinstance(placed, Placement)
    ann = placed.record().pod_annotations({c.uuid: 15 for c in placed.cards}, assume_time_ns=1)
    ann[ISOLATION_ANNOTATION] = "MPS!"  # not a tier
    pod = pod_obj("a", 5, annotations=ann, node="gpu-mps", uid="uid-a", phase="Running")
    fresh = ledger_of(tiered("gpu-mps", "mps"))
    fresh.observe_pod(read_pod(pod))
    assert fresh.used("gpu-mps", placed.cards[0].uuid) == 5
    assert fresh.ignored() == []


def test_the_nodes_device_mode_is_read_beside_its_tier_and_a_made_up_one_is_not_shown():
    from gpushare_hub.service.view import isolation_document

    annotations = {ISOLATION_ANNOTATION: "mps", "gpushare-hub.io/device-mode": "cdi"}
    iso = read_node_isolation("gpu-1", annotations, ISOLATION_ANNOTATION, "x", "gpushare-hub.io/device-mode")
    assert (iso.claimed, iso.device_mode) == ("mps", "cdi")
    hostile = {"gpushare-hub.io/device-mode": "<img src=x onerror=alert(1)>"}
    assert (
        read_node_isolation(
            "gpu-1", hostile, ISOLATION_ANNOTATION, "x", "gpushare-hub.io/device-mode"
        ).device_mode
        == ""
    )
    assert read_node_isolation("gpu-1", annotations, ISOLATION_ANNOTATION, "x").device_mode == ""
    assert isolation_document(iso)["device_mode"] == "cdi"  # the dashboard's node table shows it
