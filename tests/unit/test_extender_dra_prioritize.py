"""The DRA packing's prioritize-only verb: a DRA pod's slice read from its claim template
(untrusted, cached, bounded), scored as binpack scores, in the order core/drapacking.py's
dra-ordered-binpack model places; and the scheduler configuration that calls it."""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import pytest
from tornado.httpclient import AsyncHTTPClient

from gpushare_hub.core import Demand, Ledger, PodObject
from gpushare_hub.core.claims import read_claim
from gpushare_hub.core.drapacking import make_dra_policy
from gpushare_hub.core.names import (
    DRA_ATTR_MODEL,
    DRA_CAPACITY,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    DRA_POD_CLAIM,
    DRA_PRIORITIZE_VERB,
    DRA_REQUEST,
    DRA_SCHEDULER_NAME,
    DRA_TEMPLATE_PREFIX,
)
from gpushare_hub.core.policy import Placer
from gpushare_hub.extender.decisions import Decisions
from gpushare_hub.extender.dratemplates import ClaimTemplates, TemplateProblem, template_ask
from gpushare_hub.extender.schedconfig import DRA_WEIGHT, scheduler_config
from gpushare_hub.extender.service import ExtenderService
from gpushare_hub.extender.serving import make_server
from gpushare_hub.localcluster.processes import free_port
from tests.objects import read_node, read_nodes, read_pod, read_pods
from tests.support.dra_objects import GIB, allocated, claim, result

from .helpers import node_obj, pod_obj

NS = "jhub"
FIVE = f"{DRA_TEMPLATE_PREFIX}t4-5g"


def template(
    gib: object = "5Gi", models: tuple[str, ...] = ("Tesla-T4",), name: str = FIVE
) -> dict[str, Any]:
    """A ResourceClaimTemplate as the chart renders one (templates/dra.yaml)."""
    exactly: dict[str, Any] = {
        "deviceClassName": DRA_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": 1,
        "capacity": {"requests": {DRA_CAPACITY: gib}},
    }
    if models:
        quoted = ", ".join(f'"{m}"' for m in models)
        expr = f'device.attributes["{DRA_DRIVER}"].{DRA_ATTR_MODEL} in [{quoted}]'
        exactly["selectors"] = [{"cel": {"expression": expr}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [{"name": DRA_REQUEST, "exactly": exactly}]}}},
    }


def dra_pod(name: str, template_name: str = FIVE) -> dict[str, Any]:
    """A notebook pod as GPUShareSpawner makes it on the DRA path: no gpu-mem, a pod claim."""
    pod = pod_obj(name, ns=NS)
    pod["spec"]["resourceClaims"] = [{"name": DRA_POD_CLAIM, "resourceClaimTemplateName": template_name}]
    pod["spec"]["schedulerName"] = DRA_SCHEDULER_NAME
    return pod


class Fetcher:
    """The API server's answers for templates, counting the reads."""

    def __init__(self, objects: dict[str, Any] | None = None, error: Exception | None = None) -> None:
        self.objects = objects or {}
        self.error = error
        self.reads: list[tuple[str, str]] = []

    async def __call__(self, namespace: str, name: str) -> Any:
        self.reads.append((namespace, name))
        if self.error is not None:
            raise self.error
        return copy.deepcopy(self.objects.get(f"{namespace}/{name}"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def dra_ledger(*names: str) -> Ledger:
    return Ledger.from_objects(read_nodes([node_obj(n) for n in names]), read_pods([]))


def hold(ledger: Ledger, node: str, index: int, gib: int, name: str) -> None:
    """A claim the default scheduler allocated and reserved, counted as the informer counts it."""
    obj = allocated(claim(name, NS), [result(node, index, gib * GIB)], pods=[(f"nb-{name}", f"uid-{name}")])
    assert ledger.observe_claim(read_claim(obj)) is None


# ---- the template ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "amount,units", [("5Gi", 5), (str(5 * GIB), 5), (5 * GIB, 5), (str(5 * GIB + 1), 6), ("3Gi", 3)]
)
def test_the_charts_template_gives_its_size_in_the_ledgers_units_and_its_models(amount, units):
    ask = template_ask(template(amount), f"{NS}/{FIVE}")
    assert ask is not None and ask.units == units and ask.models == ("Tesla-T4",)
    assert template_ask(template(amount, models=("Tesla-T4", "Tesla-V100")), "x").models == (  # type: ignore[union-attr]
        "Tesla-T4",
        "Tesla-V100",
    )


def test_a_template_of_another_class_asks_nothing_of_ours():
    other = template()
    other["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    assert template_ask(other, "x") is None
    assert template_ask({"spec": {"spec": {}}}, "x") is None


def _mutate(path: list[Any], value: Any) -> dict[str, Any]:
    obj = template()
    target: Any = obj
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return obj


EXACTLY = ["spec", "spec", "devices", "requests", 0, "exactly"]
BAD = {
    "spec-not-object": (["spec"], ["x"], "spec: expected an object"),
    "requests-not-list": (["spec", "spec", "devices", "requests"], "gpu", "expected a list"),
    "too-many-requests": (["spec", "spec", "devices", "requests"], [{}] * 33, "more than 32"),
    "two-devices": ([*EXACTLY, "count"], 2, "one share of one card"),
    "count-true": ([*EXACTLY, "count"], True, "one share of one card"),
    "all-mode": ([*EXACTLY, "allocationMode"], "All", "one share of one card"),
    "no-size": ([*EXACTLY, "capacity"], {"requests": {}}, f"no {DRA_CAPACITY}"),
    "fraction": ([*EXACTLY, "capacity", "requests", DRA_CAPACITY], "5.5", "whole number of bytes"),
    "negative": ([*EXACTLY, "capacity", "requests", DRA_CAPACITY], "-5Gi", "positive"),
    "words": ([*EXACTLY, "capacity", "requests", DRA_CAPACITY], "five", "not a Kubernetes quantity"),
    "unicode-digits": ([*EXACTLY, "capacity", "requests", DRA_CAPACITY], "٥Gi", "not a Kubernetes quantity"),
    "absurd": ([*EXACTLY, "capacity", "requests", DRA_CAPACITY], "2Pi", "more than any card"),
    "selectors-not-list": ([*EXACTLY, "selectors"], {"cel": {}}, "expected a list"),
}


@pytest.mark.parametrize("path,value,words", BAD.values(), ids=BAD.keys())
def test_a_wrong_template_is_a_problem_naming_it_and_the_field(path, value, words):
    with pytest.raises(TemplateProblem) as err:
        template_ask(_mutate(path, value), f"{NS}/{FIVE}")
    assert f"ResourceClaimTemplate {NS}/{FIVE}" in str(err.value) and words in str(err.value)


def test_two_requests_of_our_class_or_a_prioritized_list_are_not_scored():
    two = template()
    requests = two["spec"]["spec"]["devices"]["requests"]
    requests.append({**copy.deepcopy(requests[0]), "name": "second"})
    with pytest.raises(TemplateProblem, match="2 requests of"):
        template_ask(two, "x")
    listed = template()
    exactly = listed["spec"]["spec"]["devices"]["requests"][0].pop("exactly")
    listed["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"] = [{"name": "a", **exactly}]
    with pytest.raises(TemplateProblem, match="prioritized list"):
        template_ask(listed, "x")


def test_an_unrecognised_selector_restricts_no_model():
    odd = template()
    odd["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": 'device.attributes["gpushare-hub.io"].model.startsWith("Tesla")'}}
    ]
    ask = template_ask(odd, "x")
    assert ask is not None and ask.models == () and ask.units == 5


# ---- the pod's demand, the cache ---------------------------------------------------------------


async def test_a_dra_pods_demand_is_its_templates_slice_read_once_per_ttl():
    fetch = Fetcher({f"{NS}/{FIVE}": template()})
    clock = Clock()
    templates = ClaimTemplates(fetch, ttl=30, clock=clock)
    pod = read_pod(dra_pod("nb"))
    demand = await templates.demand(pod)
    assert demand is not None
    assert (demand.key, demand.per_card, demand.count, demand.models) == (f"{NS}/nb", 5, 1, ("Tesla-T4",))
    await templates.demand(read_pod(dra_pod("nb2")))
    assert fetch.reads == [(NS, FIVE)]
    clock.now += 31
    await templates.demand(pod)
    assert fetch.reads == [(NS, FIVE)] * 2


async def test_pods_that_claim_no_slice_read_nothing_and_get_no_demand():
    fetch = Fetcher({f"{NS}/{FIVE}": template()})
    templates = ClaimTemplates(fetch)
    assert await templates.demand(read_pod(pod_obj("plain", 5, ns=NS))) is None
    theirs = dra_pod("theirs", "someone-elses-gpu")
    theirs["spec"]["resourceClaims"][0]["name"] = "gpu"
    assert await templates.demand(read_pod(theirs)) is None
    assert fetch.reads == []


async def test_the_cache_is_bounded():
    fetch = Fetcher()
    templates = ClaimTemplates(fetch, limit=8)
    for i in range(20):
        await templates.ask(NS, f"t-{i}")
    assert len(templates._cache) <= 8
    await templates.ask(NS, "t-19")
    assert len(fetch.reads) == 20  # the newest stayed


@pytest.mark.parametrize(
    "objects,error,words",
    [
        ({}, None, "not found"),
        ({f"{NS}/{FIVE}": template("5.5")}, None, "whole number of bytes"),
        ({f"{NS}/{FIVE}": ["not", "a", "template"]}, None, "expected an object"),
        ({}, RuntimeError("connection refused"), "cannot read it (connection refused)"),
    ],
    ids=["missing", "bad-size", "not-an-object", "api-down"],
)
async def test_a_template_that_gives_no_slice_gives_no_demand_and_a_log_line_once(
    objects, error, words, caplog
):
    fetch = Fetcher(objects, error)
    templates = ClaimTemplates(fetch)
    with caplog.at_level(logging.INFO, logger="gpushare.extender"):
        assert await templates.demand(read_pod(dra_pod("nb"))) is None
        assert await templates.demand(read_pod(dra_pod("nb2"))) is None
    lines = [r.getMessage() for r in caplog.records if FIVE in r.getMessage()]
    assert len(lines) == 1 and words in lines[0], lines
    assert len(fetch.reads) == 1


# ---- the scores ------------------------------------------------------------------------------


def test_the_fuller_node_whose_card_holds_the_slice_leads_and_a_node_without_room_scores_zero():
    ledger = dra_ledger("gpu-a", "gpu-b", "gpu-c", "gpu-d")
    hold(ledger, "gpu-a", 0, 3, "a0")
    hold(ledger, "gpu-b", 0, 9, "b0")
    for i in (0, 1):
        hold(ledger, "gpu-d", i, 12, f"d{i}")  # 3 GiB left on each card: no 5 GiB slice
    decisions = Decisions(ledger)
    demand = _demand(5)
    nodes = ["gpu-a", "gpu-b", "gpu-c", "gpu-d"]
    scores = decisions.prioritize_dra(demand, nodes)
    assert scores.get("gpu-d", 0) == 0
    assert scores["gpu-b"] == 10 and scores["gpu-b"] > scores["gpu-a"] > scores["gpu-c"]
    # Scores come from the ledger the claims feed: the same claim moved to gpu-c moves the lead.
    ledger.observe_claim(read_claim(allocated(claim("b0", NS), [result("gpu-b", 0, 9 * GIB)])), deleted=True)
    hold(ledger, "gpu-c", 1, 9, "c1")
    again = decisions.prioritize_dra(demand, nodes)
    assert again["gpu-c"] == 10 and again["gpu-c"] > again["gpu-a"] > again["gpu-b"]
    assert decisions.prioritize_dra(None, nodes) == {}


def _demand(gib: int, key: str = f"{NS}/nb") -> Demand:
    return Demand(key=key, per_card=gib, count=1, models=("Tesla-T4",))


def test_placing_by_the_top_score_follows_the_dra_ordered_binpack_model_pod_after_pod():
    """Pod after pod, the node the extender scores highest (the scheduler's pick, ties by name as
    the replay's model breaks them when the default score ties) is the node the model places on."""
    names = [f"gpu-{c}" for c in "abcd"]
    ours, model = dra_ledger(*names), dra_ledger(*names)
    decisions = Decisions(ours)
    model_placer = Placer(model, make_dra_policy("dra-ordered-binpack", model))
    sizes = [5, 3, 7, 5, 3, 7, 7, 5, 3, 3, 5, 7, 7, 5, 3, 7]
    spread = set()
    for i, gib in enumerate(sizes):
        demand = _demand(gib, f"{NS}/nb-{i}")
        scores = decisions.prioritize_dra(demand, names)
        want = model_placer.place_and_commit(demand)
        if not scores:
            assert not hasattr(want, "node"), f"pod {i}: the model placed it, the extender scored no node"
            continue
        top = max(scores.values())
        pick = min(n for n, s in scores.items() if s == top)
        assert pick == want.node, f"pod {i} ({gib} GiB): extender {pick}, model {want.node}, scores {scores}"
        # The scheduler's allocator: first fit in the driver's order, fullest card first.
        placement = Placer(ours, "binpack").placement_on(demand, pick)
        ours.commit(placement)  # type: ignore[arg-type]
        spread.add(pick)
    assert len(spread) < len(names)  # it packed: some node stayed empty


# ---- the HTTP verb -----------------------------------------------------------------------------


async def test_the_verb_scores_dra_pods_and_answers_others_and_bad_templates_with_zeros():
    service = ExtenderService(kube=None)
    for name in ("gpu-a", "gpu-b"):
        service.ledger.observe_node(read_node(node_obj(name)))
    hold(service.ledger, "gpu-b", 0, 5, "b0")
    service.informer.synced = True
    bad = f"{DRA_TEMPLATE_PREFIX}broken"
    service.templates = ClaimTemplates(
        Fetcher({f"{NS}/{FIVE}": template(), f"{NS}/{bad}": template("lots", name=bad)})
    )
    port = free_port()
    server = make_server(service, "/gpushare-scheduler")
    server.listen(port, "127.0.0.1")
    http = AsyncHTTPClient()
    url = f"http://127.0.0.1:{port}/gpushare-scheduler/{DRA_PRIORITIZE_VERB}"

    async def ask(pod: dict[str, Any]) -> tuple[int, Any]:
        body = json.dumps({"Pod": pod, "NodeNames": ["gpu-a", "gpu-b"]})
        resp = await http.fetch(url, method="POST", body=body, raise_error=False)
        return resp.code, json.loads(resp.body)

    try:
        code, out = await ask(dra_pod("nb"))
        assert code == 200 and [h["Host"] for h in out] == ["gpu-a", "gpu-b"]
        assert {h["Host"]: h["Score"] for h in out} == {"gpu-a": 0, "gpu-b": 10}
        for other in (pod_obj("plain", 5, ns=NS), dra_pod("nb-bad", bad)):
            code, out = await ask(other)
            assert code == 200 and {h["Score"] for h in out} == {0}
        resp = await http.fetch(url, method="POST", body=b"{oops", raise_error=False)
        assert resp.code == 400 and DRA_PRIORITIZE_VERB in json.loads(resp.body)["Error"]
    finally:
        server.stop()


# ---- the scheduler's configuration -------------------------------------------------------------


def test_the_dra_profile_and_its_prioritize_only_entry():
    plain = scheduler_config("http://127.0.0.1:32766/gpushare-scheduler")
    cfg = scheduler_config("http://127.0.0.1:32766/gpushare-scheduler", dra_scheduler_name=DRA_SCHEDULER_NAME)
    assert cfg["profiles"][0] == plain["profiles"][0] and cfg["extenders"][0] == plain["extenders"][0]
    assert cfg["profiles"][1] == {"schedulerName": DRA_SCHEDULER_NAME}  # DynamicResources stays on
    entry = cfg["extenders"][1]
    assert entry["prioritizeVerb"] == DRA_PRIORITIZE_VERB and entry["ignorable"] is True
    assert not {"filterVerb", "bindVerb", "managedResources", "preemptVerb"} & set(entry)
    # One step of its 0..10 score outweighs what the default plugins that vary between nodes add
    # (NodeResourcesFit, BalancedAllocation, ImageLocality at weight 1, PodTopologySpread at 2).
    assert entry["weight"] == DRA_WEIGHT and DRA_WEIGHT * 10 > 100 * (1 + 1 + 1 + 2)
    tls = scheduler_config("https://x", https=True, tls_config={"caFile": "/ca"}, dra_scheduler_name="d")
    assert tls["extenders"][1]["tlsConfig"] == {"caFile": "/ca"} and tls["extenders"][1]["enableHTTPS"]


def test_a_pod_object_read_from_the_spawners_shape_claims_a_slice():
    pod: PodObject = read_pod(dra_pod("nb"))
    assert pod.claims_dra_slice and pod.resource_claims[0].template_name == FIVE
