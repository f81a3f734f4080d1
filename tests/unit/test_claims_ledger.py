"""ResourceClaims of our DRA driver in the ledger: read as untrusted as annotations, counted like them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpushare_hub.core import CardShare
from gpushare_hub.core.annotations import AllocationRecord
from gpushare_hub.core.claims import ClaimIgnored, claim_key, memory_bytes, read_claim, units_of
from gpushare_hub.core.errors import InvalidObject
from gpushare_hub.core.ledger import Ledger
from gpushare_hub.core.names import ALLOCATION_ANNOTATION
from gpushare_hub.core.records import Ignored
from gpushare_hub.core.resources import ResourceNames
from gpushare_hub.core.shapes import read_node, read_pod
from gpushare_hub.inspect import claims as inspect_claims
from gpushare_hub.inspect import cli
from gpushare_hub.kube import ApiError, LedgerInformer
from gpushare_hub.kube.rest import ApiStatusError
from tests.support.dra_objects import GIB, allocated, claim, result

from . import fakeapi
from .helpers import node_obj, pod_obj

UUID0 = "GPU-sim-gpu-1-0"


def ledger_with(*nodes: str) -> Ledger:
    ledger = Ledger()
    for n in nodes:
        ledger.observe_node(read_node(node_obj(n)))
    return ledger


def observe(ledger: Ledger, obj: dict[str, Any], deleted: bool = False) -> Any:
    return ledger.observe_claim(read_claim(obj), deleted=deleted)


def held(ledger: Ledger) -> dict[str, tuple[str, tuple[tuple[str, int], ...]]]:
    return {a.key: (a.node, tuple((s.uuid, s.units) for s in a.cards)) for a in ledger.allocations()}


def test_an_allocated_reserved_claim_counts_for_its_pod_like_an_annotation():
    ledger = ledger_with("gpu-1")
    assert observe(ledger, allocated(claim("c1"), [result("gpu-1", 0, "5Gi")], [("nb", "uid-nb")])) is None
    assert held(ledger) == {"jhub/nb": ("gpu-1", ((UUID0, 5),))}
    assert ledger.used("gpu-1", UUID0) == 5
    assert ledger.allocation("jhub/nb").uid == "uid-nb"
    # The same hold written as an annotation gives the same snapshot, pod for pod.
    rec = AllocationRecord(node="gpu-1", cards=(CardShare(UUID0, 0, 5),), containers=())
    pod = pod_obj("nb", 5, node="gpu-1", phase="Running", annotations={ALLOCATION_ANNOTATION: rec.to_json()})
    other = ledger_with("gpu-1")
    assert other.observe_pod(read_pod(pod)) is None
    assert ledger.snapshot() == other.snapshot()


@pytest.mark.parametrize(
    ("memory", "units"),
    [("5Gi", 5), ("5368709120", 5), (str(5 * GIB + 1), 6), ("1", 1), ("15Gi", 15), ("5e9", 5), ("2.5Gi", 3)],
)
def test_consumed_bytes_are_counted_in_units_rounded_up(memory, units):
    ledger = ledger_with("gpu-1")
    assert observe(ledger, allocated(claim("c"), [result("gpu-1", 1, memory)], [("nb", "u")])) is None
    assert ledger.used("gpu-1", "GPU-sim-gpu-1-1") == units


def test_units_follow_the_configured_unit():
    assert units_of(5 * GIB, ResourceNames(unit="MiB")) == 5 * 1024
    assert units_of(1024**2 + 1, ResourceNames(unit="MiB")) == 2


@pytest.mark.parametrize("bad", ["1.5", "-5Gi", "500m", "0", "1e30", "5 Gi", "abc", "", "1Ei", "0.1Ki"])
def test_a_bad_consumed_capacity_is_refused_naming_the_claim(bad):
    with pytest.raises(ValueError):
        memory_bytes(bad)
    ledger = ledger_with("gpu-1")
    rec = observe(ledger, allocated(claim("c"), [result("gpu-1", 0, bad)], [("nb", "u")]))
    assert isinstance(rec, ClaimIgnored) and rec.reason is Ignored.WRONG_AMOUNT
    assert "ResourceClaim jhub/c" in rec.message() and "gpu-0" in rec.message()
    assert ledger.allocations() == [] and ledger.used("gpu-1", UUID0) == 0
    assert [r.key for r in ledger.ignored()] == ["jhub/nb"]


def test_other_drivers_claims_hold_nothing_and_are_not_reported():
    ledger = ledger_with("gpu-1")
    other = allocated(claim("c"), [result("gpu-1", 0, "5Gi", driver="gpu.nvidia.com")], [("nb", "u")])
    assert observe(ledger, other) is None
    assert ledger.allocations() == [] and ledger.ignored() == []


def test_a_claim_for_an_unknown_card_is_ignored():
    ledger = ledger_with("gpu-1")  # two cards: gpu-0, gpu-1
    for device in ("gpu-7", "gpu-x", "gpu-²", "card-0", "gpu--1"):
        rec = observe(ledger, allocated(claim("c"), [result("gpu-1", 0, device=device)], [("nb", "u")]))
        assert isinstance(rec, ClaimIgnored) and rec.reason is Ignored.UNKNOWN_CARD, device
        assert device in rec.message()
    assert ledger.allocations() == []


def test_a_claim_on_an_unknown_node_waits_for_the_node():
    ledger = ledger_with("gpu-1")
    assert observe(ledger, allocated(claim("c"), [result("gpu-9", 1, "3Gi")], [("nb", "u")])) is None
    assert ledger.allocations() == []
    assert ledger.observe_node(read_node(node_obj("gpu-9"))) == []
    assert held(ledger) == {"jhub/nb": ("gpu-9", (("GPU-sim-gpu-9-1", 3),))}


def test_results_on_two_pools_are_refused():
    ledger = ledger_with("gpu-1", "gpu-2")
    rec = observe(ledger, allocated(claim("c"), [result("gpu-1", 0), result("gpu-2", 0)], [("nb", "u")]))
    assert isinstance(rec, ClaimIgnored) and rec.reason is Ignored.WRONG_NODE
    assert ledger.allocations() == []


def test_no_card_is_overcommitted_and_a_blocked_claim_counts_once_units_come_back():
    ledger = ledger_with("gpu-1")  # 15 GiB cards
    assert observe(ledger, allocated(claim("a"), [result("gpu-1", 0, "10Gi")], [("pa", "ua")])) is None
    rec = observe(ledger, allocated(claim("b"), [result("gpu-1", 0, "10Gi")], [("pb", "ub")]))
    assert rec is not None and rec.reason is Ignored.CARD_FULL and "ResourceClaim jhub/b" in rec.message()
    assert ledger.used("gpu-1", UUID0) == 10
    assert [r.message() for r in ledger.ignored()] == [rec.message()]
    observe(ledger, allocated(claim("a"), [result("gpu-1", 0, "10Gi")], [("pa", "ua")]), deleted=True)
    assert held(ledger) == {"jhub/pb": ("gpu-1", ((UUID0, 10),))}
    assert ledger.ignored() == []


def test_a_claim_larger_than_its_card_is_refused():
    ledger = ledger_with("gpu-1")
    rec = observe(ledger, allocated(claim("a"), [result("gpu-1", 0, "16Gi")], [("pa", "ua")]))
    assert rec is not None and rec.reason is Ignored.WRONG_AMOUNT
    assert ledger.used("gpu-1", UUID0) == 0


@pytest.mark.parametrize("how", ["deleted", "deallocated", "unreserved"])
def test_a_claim_deleted_deallocated_or_no_longer_reserved_releases_its_units(how):
    ledger = ledger_with("gpu-1")
    c = allocated(claim("c"), [result("gpu-1", 0, "5Gi")], [("nb", "u")])
    observe(ledger, c)
    assert ledger.used("gpu-1", UUID0) == 5
    if how == "deleted":
        observe(ledger, c, deleted=True)
    elif how == "deallocated":
        observe(ledger, claim("c"))
    else:
        observe(ledger, allocated(claim("c"), [result("gpu-1", 0, "5Gi")], []))
    assert ledger.allocations() == [] and ledger.used("gpu-1", UUID0) == 0
    assert ledger.claim_allocation("jhub/c") is None


def test_an_allocated_claim_not_yet_reserved_holds_under_its_own_key_then_moves_to_its_pod():
    ledger = ledger_with("gpu-1")
    observe(ledger, allocated(claim("c"), [result("gpu-1", 0, "5Gi")]))
    assert held(ledger) == {claim_key("jhub", "c"): ("gpu-1", ((UUID0, 5),))}
    assert ledger.held_by_claim(claim_key("jhub", "c"))
    observe(ledger, allocated(claim("c"), [result("gpu-1", 0, "5Gi")], [("nb", "u")]))
    assert held(ledger) == {"jhub/nb": ("gpu-1", ((UUID0, 5),))}
    assert ledger.used("gpu-1", UUID0) == 5


def test_a_missing_consumed_capacity_holds_the_whole_card():
    ledger = ledger_with("gpu-1")
    observe(ledger, allocated(claim("c"), [result("gpu-1", 1, None)], [("nb", "u")]))
    assert ledger.used("gpu-1", "GPU-sim-gpu-1-1") == 15


def test_a_pods_claim_wins_over_its_annotation_which_counts_again_when_the_claim_goes():
    ledger = ledger_with("gpu-1")
    rec = AllocationRecord(node="gpu-1", cards=(CardShare("GPU-sim-gpu-1-1", 1, 7),), containers=())
    pod = read_pod(
        pod_obj("nb", 7, node="gpu-1", phase="Running", annotations={ALLOCATION_ANNOTATION: rec.to_json()})
    )
    ledger.observe_pod(pod)
    c = allocated(claim("c"), [result("gpu-1", 0, "5Gi")], [("nb", "uid-nb")])
    observe(ledger, c)
    assert held(ledger) == {"jhub/nb": ("gpu-1", ((UUID0, 5),))}  # one allocation: the claim's
    assert ledger.used("gpu-1", "GPU-sim-gpu-1-1") == 0
    ledger.observe_pod(pod)  # a pod event changes nothing while the claim holds
    ledger.observe_pod(pod, deleted=True)
    ledger.observe_pod(pod)
    assert held(ledger) == {"jhub/nb": ("gpu-1", ((UUID0, 5),))}
    observe(ledger, c, deleted=True)
    assert held(ledger) == {"jhub/nb": ("gpu-1", (("GPU-sim-gpu-1-1", 7),))}


def test_every_claim_of_a_pod_counts_as_prepare_and_the_scheduler_count_them():
    # Two 7 GiB claims reserved for one pod: the scheduler consumed 14 GiB, Prepare gave 14.
    ledger = ledger_with("gpu-1")
    assert observe(ledger, allocated(claim("a"), [result("gpu-1", 0, "7Gi")], [("nb", "u")])) is None
    assert observe(ledger, allocated(claim("b"), [result("gpu-1", 0, "7Gi")], [("nb", "u")])) is None
    assert held(ledger) == {"jhub/nb": ("gpu-1", ((UUID0, 14),))}
    assert ledger.used("gpu-1", UUID0) == 14 and ledger.ignored() == []
    # On two cards the pod holds both.
    observe(ledger, allocated(claim("b"), [result("gpu-1", 1, "7Gi")], [("nb", "u")]))
    assert held(ledger) == {"jhub/nb": ("gpu-1", ((UUID0, 7), ("GPU-sim-gpu-1-1", 7)))}
    # Each claim lets go of its own units only.
    observe(ledger, allocated(claim("a"), [result("gpu-1", 0, "7Gi")], [("nb", "u")]), deleted=True)
    assert held(ledger) == {"jhub/nb": ("gpu-1", (("GPU-sim-gpu-1-1", 7),))}
    assert ledger.claim_allocation("jhub/a") is None and ledger.claim_allocation("jhub/b") is not None
    observe(ledger, allocated(claim("b"), [result("gpu-1", 1, "7Gi")], [("nb", "u")]), deleted=True)
    assert ledger.allocations() == [] and ledger.used("gpu-1", "GPU-sim-gpu-1-1") == 0


def test_a_pods_claim_that_does_not_fit_beside_its_others_is_refused_alone_and_counts_later():
    ledger = ledger_with("gpu-1")  # 15 GiB cards
    observe(ledger, allocated(claim("a"), [result("gpu-1", 0, "7Gi")], [("nb", "u")]))
    observe(ledger, allocated(claim("o"), [result("gpu-1", 0, "5Gi")], [("other", "uo")]))
    rec = observe(ledger, allocated(claim("b"), [result("gpu-1", 0, "7Gi")], [("nb", "u")]))
    assert isinstance(rec, ClaimIgnored) and rec.reason is Ignored.CARD_FULL
    assert "ResourceClaim jhub/b" in rec.message() and "claims 7" in rec.message()
    assert held(ledger)["jhub/nb"] == ("gpu-1", ((UUID0, 7),))  # the pod keeps its first claim
    assert ledger.used("gpu-1", UUID0) == 12
    observe(ledger, allocated(claim("o"), [result("gpu-1", 0, "5Gi")], [("other", "uo")]), deleted=True)
    assert held(ledger) == {"jhub/nb": ("gpu-1", ((UUID0, 14),))} and ledger.ignored() == []


def test_a_pods_claims_on_two_nodes_count_on_the_first_node_only():
    ledger = ledger_with("gpu-1", "gpu-2")
    observe(ledger, allocated(claim("a"), [result("gpu-1", 0, "5Gi")], [("nb", "u")]))
    rec = observe(ledger, allocated(claim("b"), [result("gpu-2", 0, "5Gi")], [("nb", "u")]))
    assert isinstance(rec, ClaimIgnored) and rec.reason is Ignored.WRONG_NODE and "gpu-1" in rec.message()
    assert held(ledger) == {"jhub/nb": ("gpu-1", ((UUID0, 5),))}


def test_a_claim_reserved_for_several_pods_is_counted_once_and_reported():
    ledger = ledger_with("gpu-1")
    shared = allocated(claim("s"), [result("gpu-1", 0, "7Gi")], [("p1", "u1"), ("p2", "u2"), ("p3", "u3")])
    rec = observe(ledger, shared)
    assert held(ledger) == {"jhub/p1": ("gpu-1", ((UUID0, 7),))}  # the units the scheduler took, once
    assert isinstance(rec, ClaimIgnored) and rec.reason is Ignored.SHARED
    told = [r.message() for r in ledger.ignored()]
    assert told == [rec.message()]
    assert "ResourceClaim jhub/s" in told[0] and "3 pods" in told[0] and "jhub/p2" in told[0]
    assert "holds no card" not in told[0]
    # kubectl inspect gpushare and the extender's /inspect show it as they show a forged record.
    report = inspect_claims.report_with_claims([read_node(node_obj("gpu-1"))], [], [read_claim(shared)])
    assert rec.message() in report.warnings
    # Reserved for one pod again: nothing to report.
    observe(ledger, allocated(claim("s"), [result("gpu-1", 0, "7Gi")], [("p1", "u1")]))
    assert ledger.ignored() == []


@pytest.mark.parametrize(
    "broken",
    [
        {"status": {"allocation": {"devices": {"results": "x"}}}},
        {"status": {"allocation": {"devices": {"results": [{"driver": 5}]}}}},
        {"status": {"reservedFor": [{"name": ["x"]}]}},
        {"status": {"allocation": {"devices": {"results": [{}] * 300}}}},
    ],
)
def test_a_claim_of_the_wrong_shape_is_refused_naming_it(broken):
    with pytest.raises(InvalidObject, match="ResourceClaim jhub/c"):
        read_claim({**claim("c"), **broken})


# ---- the informer ---------------------------------------------------------------------------------


class Listing:
    """One kind's API: lists (or an error) in turn, then one watch stream, then quiet."""

    def __init__(self, lists: list[Any], stream: list[tuple[str, dict[str, Any]]] | None = None) -> None:
        self.lists, self.stream = lists, stream

    async def list_page(self, limit: int, cont: str) -> tuple[list[dict[str, Any]], str, str]:
        got = self.lists.pop(0)
        if isinstance(got, BaseException):
            raise got
        return got, "1", ""

    async def watch(self, rv: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        stream, self.stream = self.stream, None
        for item in stream or []:
            yield item
        await asyncio.Event().wait()


async def until(cond: Any) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_the_informer_lists_and_watches_claims():
    c = allocated(claim("c"), [result("gpu-1", 0, "5Gi")], [("nb", "u")])
    inf = LedgerInformer(None)
    seen: list[tuple[str, str]] = []
    inf.on_claim(lambda t, o: seen.append((t, o.key)))
    inf._resources = {  # type: ignore[dict-item]
        "nodes": Listing([[node_obj("gpu-1")]]),
        "pods": Listing([[]]),
        "resourceclaims": Listing([[c]], [("DELETED", c)]),
    }
    await inf.start()
    try:
        assert inf.claims_watched
        assert ("ADDED", "jhub/c") in seen
        await until(lambda: ("DELETED", "jhub/c") in seen)
        assert inf.ledger.allocations() == []
    finally:
        await inf.stop()


async def test_a_relist_deletes_the_claims_that_vanished_and_keeps_pod_relists_off_them():
    c = allocated(claim("c"), [result("gpu-1", 0, "5Gi")], [("nb", "u")])
    inf = LedgerInformer(None)
    inf._resources = {  # type: ignore[dict-item]
        "nodes": Listing([[node_obj("gpu-1")]]),
        "pods": Listing([[], []]),
        "resourceclaims": Listing([[c], []]),
    }
    await inf.relist("nodes")
    await inf.relist("resourceclaims")
    await inf.relist("pods")  # no pod listed: the claim's hold is not a pod's to take back
    assert [a.key for a in inf.ledger.allocations()] == ["jhub/nb"]
    await inf.relist("resourceclaims")
    assert inf.ledger.allocations() == [] and inf.ledger.claims() == []


@pytest.mark.parametrize("status", [403, 404])
async def test_without_resource_claims_the_ledger_keeps_working_on_annotations(status, caplog):
    inf = LedgerInformer(None)
    inf._resources = {  # type: ignore[dict-item]
        "nodes": Listing([[node_obj("gpu-1")]]),
        "pods": Listing([[pod_obj("p", 3, node="gpu-1", phase="Running")]]),
        "resourceclaims": Listing([ApiError(status=status, reason="nope")]),
    }
    with caplog.at_level(logging.WARNING, logger="gpushare.informer"):
        await inf.start()
    try:
        assert inf.synced and not inf.claims_watched
        assert inf.stale_for() == 0.0
        told = [r.getMessage() for r in caplog.records if "ResourceClaims" in r.getMessage()]
        assert len(told) == 1 and str(status) in told[0]
        assert {t.get_name() for t in inf._tasks} == {"watch-nodes", "watch-pods"}
    finally:
        await inf.stop()


# ---- kubectl inspect gpushare -------------------------------------------------------------------

pki = fakeapi.pki  # fixtures: a loopback API server
apiserver = fakeapi.apiserver


def kubeconfig(path, server: str, ca: str) -> str:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
                "users": [{"name": "u", "user": {"token": "good-token"}}],
            }
        )
    )
    return str(path)


def test_kubectl_inspect_counts_claims_beside_annotations(tmp_path, capsys, apiserver, pki):
    rec = AllocationRecord(node="gpu-1", cards=(CardShare(UUID0, 0, 3),), containers=())
    old = pod_obj("old", 3, node="gpu-1", phase="Running", annotations={ALLOCATION_ANNOTATION: rec.to_json()})
    apiserver.lists["/api/v1/nodes"] = [node_obj("gpu-1")]
    apiserver.lists["/api/v1/pods"] = [old]
    apiserver.lists["/apis/resource.k8s.io/v1/resourceclaims"] = [
        allocated(claim("c"), [result("gpu-1", 0, "5Gi")], [("nb", "u")]),
        allocated(claim("bad"), [result("gpu-1", 1, "1.5")], [("nb2", "u2")]),
    ]
    kc = kubeconfig(tmp_path / "kc", apiserver.server, str(pki.ca))
    assert cli.main(["--kubeconfig", kc, "--json"]) == 0
    out = capsys.readouterr()
    card = json.loads(out.out)["nodes"][0]["cards"][0]
    assert card["used"] == 8
    assert sorted((p["name"], p["units"]) for p in card["pods"]) == [("nb", 5), ("old", 3)]
    assert "ResourceClaim jhub/bad" in out.err


def test_kubectl_inspect_without_the_rbac_for_claims_says_so_and_counts_annotations(
    tmp_path, capsys, apiserver, pki, monkeypatch
):
    apiserver.lists["/api/v1/nodes"] = [node_obj("gpu-1")]
    apiserver.lists["/api/v1/pods"] = []
    real = inspect_claims.list_claims

    class Refusing:
        def list(self, path: str) -> Any:
            raise ApiStatusError("https://x", 403, "Forbidden")

    monkeypatch.setattr(cli, "list_claims", lambda api: real(Refusing()))
    kc = kubeconfig(tmp_path / "kc", apiserver.server, str(pki.ca))
    assert cli.main(["--kubeconfig", kc, "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["total"] == 30
    assert "resourceclaims" in out.err


def test_unrelated_claims_are_neither_kept_nor_told():
    # A user churning claims of other drivers costs no memory and wakes no subscriber.
    inf = LedgerInformer(None)
    told: list[str] = []
    inf.on_claim(lambda t, o: told.append(o.key))
    inf.apply("nodes", "ADDED", node_obj("gpu-1"))
    for i in range(20_000):
        if i % 2:
            obj = claim(f"c{i}", ns="team-x", device_class="gpu.nvidia.com")
        else:
            obj = allocated(
                claim(f"c{i}", ns="team-x", device_class="example.com-fpga"),
                [result("gpu-1", 0, None, driver="fpga.example.com")],
                [(f"p{i}", "u")],
            )
        inf.apply("resourceclaims", "ADDED", obj)
        inf.apply("resourceclaims", "DELETED", obj)
        inf.apply("resourceclaims", "ADDED", obj)
    assert told == []
    assert inf.ledger.claims() == [] and inf._reported["resourceclaims"] == {}
    # Ours by class (not allocated yet) or by driver (allocated from another class) are kept.
    inf.apply("resourceclaims", "ADDED", claim("mine"))
    by_driver = allocated(claim("d", device_class="other-class"), [result("gpu-1", 0, "5Gi")], [("nb", "u")])
    inf.apply("resourceclaims", "ADDED", by_driver)
    assert told == ["jhub/mine", "jhub/d"] and inf.ledger.claims() == ["jhub/d", "jhub/mine"]
    # A kept claim that stops being ours is forgotten, and its subscribers told.
    inf.apply("resourceclaims", "MODIFIED", claim("d", device_class="other-class"))
    assert inf.ledger.claims() == ["jhub/mine"] and told[-1] == "jhub/d"
    assert inf.ledger.allocations() == []


def test_the_book_keeps_only_claims_of_our_driver_or_class():
    ledger = ledger_with("gpu-1")
    observe(ledger, claim("other", device_class="gpu.nvidia.com"))
    observe(ledger, claim("ours"))
    assert ledger.claims() == ["jhub/ours"]
