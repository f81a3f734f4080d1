"""The hub service's pure parts: documents, fragmentation, query checks, metrics, hub config."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from traitlets.config import Config

from gpushare_hub.core import DEFAULT_NAMES, Demand, Ledger
from gpushare_hub.core.catalogue import CatalogueError
from gpushare_hub.core.catalogueread import read_catalogue
from gpushare_hub.core.names import CARDS_ANNOTATION
from gpushare_hub.core.report import build_report
from gpushare_hub.core.reportfacts import PendingPod, pod_facts
from gpushare_hub.core.reportrows import Report
from gpushare_hub.core.verdict import Reason
from gpushare_hub.service import admin_scope, configure_hub, metrics_scope
from gpushare_hub.service.hubconfig import CONFIG_ENV
from gpushare_hub.service.hubroles import SERVICE_SCOPES
from gpushare_hub.service.hubservers import HubServer, servers_from_users
from gpushare_hub.service.metrics import NO_HUB_USER, OTHERS, per_user, render_metrics
from gpushare_hub.service.query import FILTER_KEYS, Filters, QueryError, parse_query
from gpushare_hub.service.view import availability_document, ledger_document, me_document
from gpushare_hub.service.waiting import (
    LABELS,
    SCHEDULER_WORDS,
    VERDICT_LABELS,
    pending_label,
    pending_labels,
)
from tests.objects import read_node, read_nodes, read_pod, read_pods
from tests.support.inspect_cluster import fixture_cluster, placed
from tests.unit.helpers import node_obj, pod_obj

NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
SLICES = [
    {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]},
    {"slug": "t4-7g", "display_name": "Tesla T4 · 7 GiB", "gib": 7, "models": ["Tesla-T4"]},
]
SERVERS = [
    HubServer("alice", "", "2026-11-22T11:00:00Z", "2026-11-22T11:50:00Z"),
    HubServer("bob", "big", "2026-11-22T10:00:00Z", "2026-11-22T11:59:30Z"),
]


def doc(slices: list[dict[str, Any]] = SLICES, filters: Filters | None = None) -> dict[str, Any]:
    nodes, pods = fixture_cluster()
    report = build_report(read_nodes(nodes), read_pods(pods))
    return ledger_document(report, SERVERS, read_catalogue(slices), NOW, filters or Filters())


def me_of(
    user: str, report: Report | None = None, free: dict[str, Any] | None = None, spawn_url: str = ""
) -> dict[str, Any]:
    """``api/v1/me``'s document for ``user`` (of the fixture cluster when no report is given)."""
    if report is None:
        nodes, pods = fixture_cluster()
        report = build_report(read_nodes(nodes), read_pods(pods))
    return me_document(report, SERVERS, user, NOW, 1800, free, spawn_url)


def test_ledger_joins_pods_with_hub_servers_and_says_how_long_each_is_idle():
    d = doc()
    by_pod = {a["pod"]: a for a in d["allocations"]}
    assert set(by_pod) == {"jupyter-alice", "jupyter-bob", "jupyter-carol", "legacy"}
    alice, bob = by_pod["jupyter-alice"], by_pod["jupyter-bob"]
    assert (alice["hub_user"], alice["server"], alice["node"], alice["units"]) == ("alice", "", "gpu-a", 5)
    assert alice["card_uuid"] == bob["card_uuid"] != by_pod["jupyter-carol"]["card_uuid"]
    assert (alice["idle_seconds"], bob["idle_seconds"]) == (600, 30)
    assert bob["started"] == "2026-11-22T10:00:00Z" and bob["server"] == "big"
    assert by_pod["jupyter-carol"]["idle_seconds"] is None  # no hub server known for carol
    cards = {c["uuid"]: c for n in d["nodes"] for c in n["cards"]}
    assert cards[alice["card_uuid"]]["free"] == 5 and len(cards[alice["card_uuid"]]["allocations"]) == 2
    assert d["models"] == {"Tesla-T4": {"cards": 4, "units": 60, "used": 20, "free": 40, "fragment": 0}}
    assert [p["pod"] for p in d["pending"]] == ["jupyter-dave"]
    assert "16 GiB" in d["pending"][0]["reason"]


def test_fragmentation_counts_free_blocks_smaller_than_every_slice_of_the_model():
    # With 5 GiB slices every free block of the fixture (5, 8, 15, 12) is usable.
    assert doc()["fragmentation"]["units"] == 0
    # With only 7 GiB slices the 5 GiB left beside alice and bob is a fragment.
    only7 = doc([SLICES[1]])
    assert only7["fragmentation"]["units"] == 5
    assert [c["fragment"] for n in only7["nodes"] for c in n["cards"]] == [5, 0, 0, 0]
    assert only7["models"]["Tesla-T4"]["fragment"] == 5  # the per-model total
    # A model that no slice may use: all its free memory is a fragment.
    a10 = [{"slug": "a10-5g", "display_name": "A10 5", "gib": 5, "models": ["A10"]}]
    assert doc(a10)["fragmentation"]["units"] == 40


def test_filters_keep_only_the_asked_node_model_and_user():
    d = doc(filters=Filters(user="bob"))
    assert [a["hub_user"] for a in d["allocations"]] == ["bob"]
    assert [n["name"] for n in d["nodes"]] == ["gpu-a"]  # only the cards holding bob's slices
    assert [len(n["cards"]) for n in d["nodes"]] == [1]
    d = doc(filters=Filters(node="gpu-b"))
    assert [n["name"] for n in d["nodes"]] == ["gpu-b"] and d["pending"] == []
    assert doc(filters=Filters(model="A100"))["nodes"] == []


def test_me_shows_only_the_callers_own_slices():
    me = me_of("bob")
    assert [(a["pod"], a["server"]) for a in me["allocations"]] == [("jupyter-bob", "big")]
    assert me_of("nobody")["allocations"] == []


def test_a_pod_outside_the_hubs_namespace_is_never_attributed_to_a_hub_user():
    """Someone who may create pods in another namespace writes alice's name on one: it holds its
    card on the dashboard, but under no user, and is not in alice's api/v1/me."""
    nodes, pods = fixture_cluster()
    forged = placed("forged", 3, "gpu-b", 0, "alice")
    forged["metadata"]["namespace"] = "team-x"
    report = build_report(read_nodes(nodes), read_pods([*pods, forged]), hub_namespaces={"jhub"})
    ledger = ledger_document(report, SERVERS, read_catalogue(SLICES), NOW)
    mine = [a["pod"] for a in me_of("alice", report)["allocations"]]
    assert mine == ["jupyter-alice"]
    held = {a["pod"]: a["hub_user"] for a in ledger["allocations"]}
    assert held["forged"] == "" and held["jupyter-alice"] == "alice"
    # Without the boundary (the CLI, run by admins) the annotation is shown as written.
    open_report = build_report(read_nodes(nodes), read_pods([*pods, forged]))
    assert any(
        p.hub_user == "alice" and p.name == "forged"
        for n in open_report.nodes
        for c in n.cards
        for p in c.pods
    )


@pytest.mark.parametrize(
    ("query", "param", "words"),
    [
        ({"colour": [b"red"]}, "colour", "takes node, model, user"),
        ({"node": [b"Bad_Node!"]}, "node", "is not a node name"),
        ({"user": [b"a", b"b"]}, "user", "given 2 times"),
        ({"model": [b"<script>"]}, "model", "is not a card model"),
        ({"refresh": [b"abc"]}, "refresh", "number of seconds"),
        ({"refresh": [b"0"]}, "refresh", "from 1 to 3600"),
        ({"refresh": ["²".encode()]}, "refresh", "number of seconds"),  # isdigit(), but not int()
        ({"refresh": [b"9" * 5000]}, "refresh", "number of seconds"),
        ({"user": [b"alice\n"]}, "user", "is not a hub user name"),
        ({"node": [b"nb-1\n"]}, "node", "is not a node name"),
    ],
)
def test_malformed_query_parameters_are_refused_naming_the_parameter(query, param, words):
    with pytest.raises(QueryError) as err:
        parse_query(query, (*FILTER_KEYS, "refresh") if param != "colour" else FILTER_KEYS)
    assert err.value.param == param and words in str(err.value)


def test_good_query_parameters_are_read():
    f = parse_query(
        {"node": [b"nb-1"], "model": [b"Tesla-T4"], "user": [b"ann"], "refresh": [b"7"]},
        (*FILTER_KEYS, "refresh"),
    )
    assert f == Filters("nb-1", "Tesla-T4", "ann", 7)


def test_availability_carries_counts_and_reasons_but_no_names():
    nodes, pods = fixture_cluster()
    ledger = Ledger.from_objects(read_nodes(nodes), read_pods(pods))
    cat = read_catalogue([*SLICES, {"slug": "big", "display_name": "16", "gib": 16}])
    a = availability_document(ledger, cat, {}, NOW)
    slices = {s["slug"]: s for s in a["slices"]}
    assert slices["t4-5g"]["placeable"] and slices["t4-5g"]["free"] == 1 + 1 + 3 + 2
    assert slices["big"]["never_fits"] and "15 GiB" in slices["big"]["reason"]
    # The spawn form's short text, not the placer's words ("pod slice/big asks ... (node ...)").
    assert slices["big"]["reason"] == slices["big"]["text"]
    text = json.dumps(a)
    for name in ("alice", "bob", "carol", "jupyter", "gpu-a", "gpu-b", "pod "):
        assert name not in text
    unknown = availability_document(None, cat, {}, NOW)
    assert not unknown["slices"][0]["known"] and "unknown" in unknown["slices"][0]["text"]


def test_a_node_with_an_unreadable_inventory_is_listed_with_the_reason():
    nodes, pods = fixture_cluster()
    broken = node_obj("gpu-broken")
    broken["metadata"]["annotations"][CARDS_ANNOTATION] = "not json"
    d = ledger_document(
        build_report(read_nodes([*nodes, broken]), read_pods(pods)), [], read_catalogue(SLICES), NOW
    )
    (row,) = [n for n in d["nodes"] if n["name"] == "gpu-broken"]
    assert row["cards"] == [] and "card inventory unreadable" in row["problem"]


def pending_pod(pod: dict[str, Any]) -> PendingPod | None:
    """What the service keeps of a pod for the metrics: its facts' pending part."""
    facts = pod_facts(read_pod(pod), DEFAULT_NAMES)
    return None if facts is None else facts.pending


def fixture_pending() -> dict[str, PendingPod]:
    _, pods = fixture_cluster()
    return {w.demand.key: w for pod in pods if (w := pending_pod(pod)) is not None}


def test_metrics_parse_and_match_the_ledger():
    d = doc([SLICES[1]])
    nodes, pods = fixture_cluster()
    labels = pending_labels(fixture_pending(), Ledger.from_objects(read_nodes(nodes), read_pods(pods)))
    groups = {"alice": ["gpu-power"], "bob": ["gpu-power", "x"]}
    text = render_metrics(d, groups, {"gpu-power": 15}, labels).decode()
    fam = {f.name: f for f in text_string_to_metric_families(text)}
    used = {s.labels["card"]: s.value for s in fam["gpushare_card_used_gib"].samples}
    assert used == {c["uuid"]: c["used"] for n in d["nodes"] for c in n["cards"]}
    slices = {s.labels["card"]: s.value for s in fam["gpushare_card_slices"].samples}
    assert sorted(slices.values()) == [0, 1, 1, 2]
    assert [s.value for s in fam["gpushare_model_free_gib"].samples] == [40]
    assert [s.value for s in fam["gpushare_fragmentation_gib"].samples] == [5]
    # dave asks 16 GiB on one card; the fixture's cards hold 15 GiB
    assert [(s.labels["reason"], s.value) for s in fam["gpushare_pending_pods"].samples] == [
        ("slice_larger_than_any_card", 1)
    ]
    assert {s.labels["group"]: s.value for s in fam["gpushare_quota_used_gib"].samples} == {"gpu-power": 10}


def test_a_pending_pod_is_kept_with_its_demand_selector_and_the_schedulers_message():
    (dave,) = fixture_pending().values()
    assert (dave.demand.key, dave.demand.per_card, dave.node_selector) == ("jhub/jupyter-dave", 16, {})
    assert dave.scheduler == "0/2 nodes are available: 2 no card has 16 GiB free."
    fresh = pod_obj("new", 3)
    fresh["spec"]["nodeSelector"] = {"gpushare": "true"}
    got = pending_pod(fresh)
    assert got is not None and got.scheduler is None and got.node_selector == {"gpushare": "true"}
    # bound, finished, unreadable or not asking for a GPU: nothing to count
    assert pending_pod(pod_obj("bound", 3, node="gpu-a")) is None
    assert pending_pod(pod_obj("done", 3, phase="Failed")) is None
    assert pending_pod(pod_obj("bad", "-2")) is None
    assert pending_pod(pod_obj("cpu")) is None


def test_the_service_keeps_its_pending_pods_and_labels_them_from_the_informers_ledger():
    cluster, informer = fed_cluster()
    assert set(cluster.pending()) == {"jhub/jupyter-dave"}
    assert pending_labels(cluster.pending(), informer.ledger) == {
        "jhub/jupyter-dave": "slice_larger_than_any_card"
    }
    assert pending_labels(cluster.pending(), None) == {"jhub/jupyter-dave": "other"}  # ledger not trusted
    small = pod_obj("jupyter-erin", 3)
    informer.apply("pods", "ADDED", small)
    assert pending_labels(cluster.pending(), informer.ledger)["jhub/jupyter-erin"] == "not_scheduled_yet"
    informer.apply("pods", "MODIFIED", pod_obj("jupyter-erin", 3, node="gpu-b"))  # bound
    informer.apply("pods", "DELETED", fixture_cluster()[1][-1])  # dave gave up
    assert cluster.pending() == {}


def waits(scheduler: str | None, *ours: Reason) -> str:
    return pending_label(PendingPod(Demand("jhub/p", 5, 1), {}, scheduler), ours)


@pytest.mark.parametrize(
    ("message", "ours", "label"),
    [
        (None, (Reason.NO_ROOM,), "not_scheduled_yet"),  # the scheduler has not tried it yet
        ("0/2 nodes are available: 2 <our words>.", (Reason.NO_ROOM,), "gpu_memory_full"),
        ("0/2 nodes are available: 2 <our words>.", (Reason.NO_EMPTY_CARDS,), "gpu_memory_full"),
        (
            "0/71 nodes are available: 2 Insufficient aliyun.com/gpu-mem, 69 node(s) didn't match "
            "Pod's node affinity/selector. preemption: 0/71 nodes are available",
            (),
            "gpu_memory_full",
        ),
        ("0/3 nodes are available: 3 Insufficient cpu.", (), "cpu_or_memory"),
        ("0/3 nodes are available: 3 Insufficient memory.", (Reason.TOO_BIG,), "cpu_or_memory"),
        ("0/1 nodes are available: 1 <our words>.", (Reason.CPU,), "cpu_or_memory"),
        ("0/1 nodes are available: 1 <our words>.", (Reason.MEMORY, Reason.TOO_BIG), "cpu_or_memory"),
        ("0/3 nodes are available: 3 Insufficient ephemeral-storage.", (), "other"),
        ("0/3 nodes are available: 3 Too many pods, 3 Insufficient pods.", (), "other"),
        ("retrying shortly: <our words>", (Reason.HANDING_SLICE,), "handing_out"),
        ("retrying shortly: <our words>", (Reason.HANDING_CARDS, Reason.UNHEALTHY), "handing_out"),
        ("0/1 nodes are available: 1 <our words>.", (Reason.UNHEALTHY,), "cards_unhealthy"),
        ("0/2 nodes are available: 2 <our words>.", (Reason.TOO_BIG,), "slice_larger_than_any_card"),
        ("0/2 nodes are available: 2 <our words>.", (Reason.TOO_FEW_CARDS,), "slice_larger_than_any_card"),
        ("0/3 nodes are available: 3 node(s) had untolerated taint {gpu: yes}.", (), "taint"),
        (
            "0/3 nodes are available: 1 <our words>, 2 node(s) had untolerated taint {gpu: yes}.",
            (Reason.NO_ROOM,),
            "gpu_memory_full",
        ),
        (
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
            (),
            "node_selector",
        ),
        (
            "0/2 nodes are available: 2 <our words>.",
            (Reason.MODEL, Reason.NO_CARDS, Reason.UNREADABLE),
            "other",
        ),
        ("something the scheduler says one day", (), "other"),
        # Our own words are never read back: only the verdicts say what our share is.
        (
            "0/9 nodes are available: 1 no card on node gpu-1 has 10 GiB free; the largest free block",
            (),
            "other",
        ),
        ("0/1 nodes are available: 1 node gpu-1 has 500m CPU free, the pod asks 2000m.", (), "other"),
        ("0/1 nodes are available: 1 node gpu-1: every card is unhealthy.", (), "other"),
    ],
)
def test_pending_pods_are_counted_by_a_fixed_set_of_reasons_that_name_no_node_or_pod(message, ours, label):
    assert waits(message, *ours) == label
    assert label in LABELS


def test_every_reason_of_the_placer_has_a_label_or_is_said_to_have_none():
    labelled = set(VERDICT_LABELS)
    assert labelled | {Reason.MODEL, Reason.ISOLATION, Reason.NO_CARDS, Reason.UNREADABLE} == set(Reason)
    assert set(VERDICT_LABELS.values()) | {label for label, _ in SCHEDULER_WORDS} <= set(LABELS)


def test_a_pending_pods_label_comes_from_the_placers_verdicts_on_the_nodes_it_may_use():
    nodes = [node_obj("gpu-1", labels={"pool": "a"}), node_obj("gpu-2", labels={"pool": "b"})]
    sick = node_obj("gpu-3", labels={"pool": "c"})
    cards = json.loads(sick["metadata"]["annotations"][CARDS_ANNOTATION])
    sick["metadata"]["annotations"][CARDS_ANNOTATION] = json.dumps([{**c, "healthy": False} for c in cards])
    full = [placed(f"f{i}", 14, "gpu-1", i % 2, "x") for i in range(2)]
    ledger = Ledger.from_objects(read_nodes([*nodes, sick]), read_pods(full))
    message = "0/3 nodes are available: 3 <whatever the extender wrote>."

    def label(mem: int, pool: str | None = None, **kw: Any) -> str:
        pod = pod_obj("p", mem, **kw)
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "message": message}]
        if pool:
            pod["spec"]["nodeSelector"] = {"pool": pool}
        waiting = pending_pod(pod)
        assert waiting is not None
        return pending_labels({"jhub/p": waiting}, ledger)["jhub/p"]

    assert label(5, "a") == "gpu_memory_full"  # gpu-1's cards have 1 GiB free each
    assert label(5, "b") == "other"  # gpu-2 would take it: the scheduler's words say nothing known
    assert label(5, "c") == "cards_unhealthy"
    assert label(5) == "gpu_memory_full"  # first in the order, over gpu-3's unhealthy cards
    assert label(16, "b") == "slice_larger_than_any_card"
    assert label(15, "b", count=3) == "slice_larger_than_any_card"  # 3 cards of 5 GiB; gpu-2 has 2
    assert label(5, "nowhere") == "other"  # no node matches the selector: nothing of ours


def test_servers_from_users_skips_malformed_entries():
    servers, groups = servers_from_users(
        [
            {"name": "ann", "groups": ["g"], "servers": {"": {"started": "s", "last_activity": "l"}}},
            {"name": 3},
            "junk",
            {"name": "bo", "servers": {"x": "junk"}},
            {"name": "cy", "groups": "gpu", "servers": ["not", "a", "dict"]},
        ]
    )
    assert servers == [HubServer("ann", "", "s", "l")] and groups == {"ann": ["g"], "bo": [], "cy": []}


# ---- configure_hub -------------------------------------------------------------------------------


def hub_config() -> Config:
    c = Config()
    c.GPUShareSpawner.slices = SLICES
    c.GPUShareSpawner.node_selector = {"pool": "gpu"}
    c.GPUShareSpawner.gpu_node_selector = {"gpushare": "true"}
    c.GPUShareSpawner.quota_gib_per_group = {"gpu-power": 15}
    c.GPUShareSpawner.namespace = "jhub"
    c.JupyterHub.services = [{"name": "harness", "api_token": "x"}]
    c.JupyterHub.load_roles = [{"name": "admin", "services": ["harness"]}]
    return c


def test_configure_hub_adds_the_service_scopes_and_least_privilege_roles():
    c = hub_config()
    configure_hub(
        c, admin_users=["root"], admin_groups=["ops"], port=12345, kubeconfig="/k", metrics_services=["prom"]
    )
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert set(services) == {"harness", "gpushare"}
    svc = services["gpushare"]
    assert svc["url"] == "http://127.0.0.1:12345" and svc["command"][1:] == ["-m", "gpushare_hub.service"]
    assert svc["info"]["display_name"] == "GPU slices"
    assert svc["environment"]["KUBECONFIG"] == "/k"
    passed = json.loads(svc["environment"][CONFIG_ENV])["GPUShareService"]
    assert passed["slices"] == SLICES and passed["node_selector"] == {"pool": "gpu", "gpushare": "true"}
    assert passed["quota_gib_per_group"] == {"gpu-power": 15}
    assert passed["hub_namespaces"] == ["jhub"]  # only the spawner's pods name hub users
    assert set(c.JupyterHub.custom_scopes) == {admin_scope(), metrics_scope()}
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles["admin"] == {"name": "admin", "services": ["harness"]}
    assert roles["gpushare-service"]["scopes"] == list(SERVICE_SCOPES)
    assert not any(s.startswith("admin") or s in ("servers", "users") for s in SERVICE_SCOPES)
    assert roles["gpushare-admins"]["users"] == ["root"] and roles["gpushare-admins"]["groups"] == ["ops"]
    assert admin_scope() in roles["gpushare-admins"]["scopes"]
    assert roles["user"]["scopes"] == ["self", "access:services!service=gpushare"]
    assert roles["gpushare-metrics"]["services"] == ["prom"]
    # Every key of the service entry is one JupyterHub accepts (it refuses unknown ones at start).
    from jupyterhub.services.service import Service

    accepted = set(Service.class_traits(input=True))
    assert set(svc) <= accepted, set(svc) - accepted
    # Twice is the same as once.
    configure_hub(c, admin_users=["root"], port=12345)
    assert [s["name"] for s in c.JupyterHub.services].count("gpushare") == 1
    assert [r["name"] for r in c.JupyterHub.load_roles].count("user") == 1


def test_configure_hub_without_a_port_or_url_gives_the_service_a_free_loopback_port():
    import socket

    c = hub_config()
    configure_hub(c)
    (svc,) = [s for s in c.JupyterHub.services if s["name"] == "gpushare"]
    host, _, port = svc["url"].removeprefix("http://").partition(":")
    assert host == "127.0.0.1" and 0 < int(port) < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", int(port)))  # free: the service can listen there
    assert "ip" not in json.loads(svc["environment"][CONFIG_ENV])["GPUShareService"]


def test_configure_hub_url_puts_the_service_where_a_proxy_in_another_pod_reaches_it():
    c = hub_config()
    configure_hub(c, url="http://hub:10101")
    (svc,) = [s for s in c.JupyterHub.services if s["name"] == "gpushare"]
    passed = json.loads(svc["environment"][CONFIG_ENV])["GPUShareService"]
    assert svc["url"] == "http://hub:10101" and (passed["ip"], passed["port"]) == ("0.0.0.0", 10101)
    configure_hub(c, url="http://127.0.0.1:10102", port=10102)  # a loopback URL: only loopback
    (svc,) = [s for s in c.JupyterHub.services if s["name"] == "gpushare"]
    passed = json.loads(svc["environment"][CONFIG_ENV])["GPUShareService"]
    assert (passed["ip"], passed["port"]) == ("127.0.0.1", 10102)
    for url, kw, why in [
        ("http://hub", {}, "needs a port"),
        ("hub:10101", {}, "http://HOST:PORT"),
        ("http://hub:10101/services/x", {}, "http://HOST:PORT"),
        ("http://hub:99999", {}, "1 to 65535"),
        ("http://hub:10101", {"port": 10102}, "ports differ"),
    ]:
        with pytest.raises(ValueError, match=why):
            configure_hub(hub_config(), url=url, **kw)


def test_configure_hub_refuses_a_wrong_catalogue_naming_the_entry():
    c = Config()
    with pytest.raises(CatalogueError, match=r"slices\[0\].*unknown"):
        configure_hub(c, slices=[{"slug": "x", "display_name": "X", "gib": 5, "models": ["T9000"]}])


def test_the_service_reads_its_settings_from_configure_hubs_environment_then_file_then_command_line(
    tmp_path, monkeypatch
):
    from gpushare_hub.service.app import GPUShareService

    c = hub_config()
    configure_hub(c, port=12345)
    (svc,) = [s for s in c.JupyterHub.services if s["name"] == "gpushare"]
    monkeypatch.setenv(CONFIG_ENV, svc["environment"][CONFIG_ENV])
    extra = tmp_path / "service_config.py"
    extra.write_text("c.GPUShareService.refresh_seconds = 9\n")
    app = GPUShareService()
    app.initialize([f"--config={extra}", "--port=4321", "--GPUShareService.refresh_seconds=11"])
    assert [s.slug for s in app.catalogue.slices] == ["t4-5g", "t4-7g"]
    assert app.node_selector == {"pool": "gpu", "gpushare": "true"}
    assert app.quota_gib_per_group == {"gpu-power": 15}
    assert (app.port, app.refresh_seconds) == (4321, 11)  # the command line wins over the file

    monkeypatch.setenv(CONFIG_ENV, json.dumps({"GPUShareService": {"slices": [{"slug": "Bad Slug"}]}}))
    with pytest.raises(CatalogueError, match="slug"):
        GPUShareService().initialize([])


def fed_cluster(hub_namespaces: set[str] | None = None) -> tuple[Any, Any]:
    """The service's Cluster and its informer, fed the fixture by hand (no API server)."""
    from gpushare_hub.core import DEFAULT_NAMES
    from gpushare_hub.service.sources import Cluster, service_informer

    cluster = Cluster(lambda: service_informer(None, DEFAULT_NAMES), DEFAULT_NAMES, 30.0, hub_namespaces)
    informer = cluster._subscribed()  # what SharedLedger starts
    nodes, pods = fixture_cluster()
    for node in nodes:
        informer.apply("nodes", "ADDED", node)
    for pod in pods:
        informer.apply("pods", "ADDED", pod)
    return cluster, informer


def test_the_services_report_follows_the_informers_events_and_is_rebuilt_only_after_one():
    cluster, informer = fed_cluster()
    report = cluster.report()
    assert cluster.report() is report  # nothing changed: the same report
    held = {p.name for n in report.nodes for c in n.cards for p in c.pods}
    assert {"jupyter-alice", "jupyter-bob"} <= held
    informer.apply("pods", "DELETED", fixture_cluster()[1][0])  # alice's server stopped
    held = {p.name for n in cluster.report().nodes for c in n.cards for p in c.pods}
    assert "jupyter-alice" not in held and "jupyter-bob" in held


@pytest.mark.parametrize("hub_namespaces", [None, {"jhub"}, {"elsewhere"}])
def test_the_service_and_the_cli_make_one_report_from_the_same_cluster(hub_namespaces):
    """The service's report, made from its informer's ledger and the facts it keeps, is the one
    kubectl inspect gpushare makes from a list of the same objects; and so is its ledger document."""
    nodes, pods = fixture_cluster()
    broken = node_obj("gpu-broken")
    broken["metadata"]["annotations"][CARDS_ANNOTATION] = "not json"
    forged = placed("forged", 3, "gpu-b", 0, "alice")
    forged["metadata"]["namespace"] = "team-x"
    cluster, informer = fed_cluster(hub_namespaces)
    informer.apply("nodes", "ADDED", broken)
    informer.apply("pods", "ADDED", forged)
    from_list = build_report(
        read_nodes([*nodes, broken]), read_pods([*pods, forged]), hub_namespaces=hub_namespaces
    )
    assert cluster.report() == from_list
    assert any(n.problem.startswith("card inventory unreadable: ") for n in from_list.nodes)
    cat = read_catalogue(SLICES)
    assert ledger_document(cluster.report(), SERVERS, cat, NOW) == ledger_document(
        from_list, SERVERS, cat, NOW
    )


def test_the_service_keeps_a_few_facts_of_the_gpu_pods_and_nodes_not_the_objects():
    from gpushare_hub.core.reportfacts import NodeFacts, PodFacts

    cluster, informer = fed_cluster()
    # Active pods that ask for a GPU only: not the CPU pod, not the finished one.
    assert set(cluster.pods) == {
        "jhub/jupyter-alice",
        "jhub/jupyter-bob",
        "jhub/jupyter-carol",
        "jhub/legacy",
        "jhub/bypassed",
        "jhub/jupyter-dave",
    }
    assert all(isinstance(p, PodFacts) for p in cluster.pods.values())
    assert set(cluster.nodes) == {"gpu-a", "gpu-b"}  # not the CPU-only node
    assert cluster.nodes["gpu-a"] == NodeFacts("gpu-a", "10.0.0.1", True)
    # The informer remembers (for its next relist) only the pods it told the service of.
    assert "jhub/cpu-pod" not in informer._reported["pods"]
    # A pod that finishes leaves the service's facts; its card is free again in the ledger.
    done = placed("jupyter-carol", 7, "gpu-a", 1, "carol")
    done["status"]["phase"] = "Succeeded"
    informer.apply("pods", "MODIFIED", done)
    assert "jhub/jupyter-carol" not in cluster.pods
    assert informer.ledger.allocation("jhub/jupyter-carol") is None


def test_the_services_informer_tells_only_of_pods_that_can_hold_a_slice_and_misses_no_allocation():
    from gpushare_hub.core import DEFAULT_NAMES
    from gpushare_hub.service.sources import service_informer

    informer = service_informer(None, DEFAULT_NAMES)
    told: list[tuple[str, str]] = []
    informer.on_pod(lambda etype, pod: told.append((etype, pod.name)))
    nodes, pods = fixture_cluster()
    for node in nodes:
        informer.apply("nodes", "ADDED", node)
    for pod in pods:
        informer.apply("pods", "ADDED", pod)
    assert ("ADDED", "cpu-pod") not in told and ("ADDED", "jupyter-alice") in told
    assert informer.ledger.allocation("jhub/jupyter-alice") is not None
    # A CPU pod that someone writes a record on is told (the ledger ignores the record, and
    # the relist must be able to take it back); once the record is gone, it is told as deleted.
    cpu = pod_obj("cpu-pod", None, node="cpu-1", phase="Running")
    cpu["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] = "0"
    informer.apply("pods", "MODIFIED", cpu)
    assert told[-1] == ("MODIFIED", "cpu-pod")
    informer.apply("pods", "MODIFIED", pod_obj("cpu-pod", None, node="cpu-1", phase="Running"))
    assert told[-1] == ("DELETED", "cpu-pod") and "jhub/cpu-pod" not in informer._reported["pods"]
    informer.apply("pods", "DELETED", pod_obj("cpu-pod", None, node="cpu-1"))
    assert told[-1] == ("DELETED", "cpu-pod") and len([t for t in told if t[1] == "cpu-pod"]) == 2


@pytest.mark.parametrize(
    ("pod", "holds"),
    [
        (pod_obj("p", 5), True),
        (pod_obj("p", count=1), True),
        (
            pod_obj("p", None, init=[{"name": "i", "resources": {"requests": {"aliyun.com/gpu-mem": "2"}}}]),
            True,
        ),
        (pod_obj("p", None, annotations={"gpushare-hub.io/allocation": "{}"}), True),
        (pod_obj("p", None, annotations={"ALIYUN_COM_GPU_MEM_POD": "3"}), True),
        (pod_obj("p", None), False),
        (
            pod_obj("p", None, containers=[{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]),
            False,
        ),
        ({"metadata": {"name": "p"}, "spec": {"containers": [{"resources": None}]}}, False),
    ],
)
def test_may_hold_slice_keeps_pods_that_ask_for_either_resource_or_carry_a_record(pod, holds):
    from gpushare_hub.core.reportfacts import may_hold_slice

    assert may_hold_slice(read_pod(pod)) is holds


def test_configure_hub_in_a_pod_lets_the_service_use_the_pods_service_account(monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    c = hub_config()
    configure_hub(c, port=12345)
    (svc,) = [s for s in c.JupyterHub.services if s["name"] == "gpushare"]
    env = svc["environment"]
    assert json.loads(env[CONFIG_ENV])["GPUShareService"]["in_cluster"] is True
    assert (env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"]) == ("10.96.0.1", "443")
    assert "KUBECONFIG" not in env


def test_the_service_gets_the_hubs_home_so_its_kubernetes_client_loads_for_a_user_without_one(
    monkeypatch, tmp_path
):
    """JupyterHub passes a service almost no environment. A hub user without a passwd entry (an
    arbitrary UID; Zero to JupyterHub's uid 1000 on another image) then has no home folder, and
    kubernetes_asyncio fails as it is imported (found on a real node; the node tier checks the
    service's ledger there)."""
    monkeypatch.setenv("HOME", "/srv/jupyterhub")
    c = hub_config()
    configure_hub(c, port=12345)
    (svc,) = [s for s in c.JupyterHub.services if s["name"] == "gpushare"]
    assert svc["environment"]["HOME"] == "/srv/jupyterhub"


def test_a_slice_holder_the_hub_has_not_named_yet_makes_one_early_read_not_many():
    """The hub is read every hub_poll_seconds; a page meeting a server started since then asks for
    one read at once (its idle time shows on the next refresh), never more than one a second."""
    import asyncio

    from gpushare_hub.service.sources import HubServers

    class Counting(HubServers):
        reads = 0

        async def poll(self) -> None:
            self._last_read = time.monotonic()
            self.reads += 1
            await asyncio.sleep(0.05)
            self.servers = [HubServer("amy", ""), HubServer("bo", "")]

    async def scenario() -> Counting:
        hub = Counting("http://hub.invalid/hub/api", "t")
        hub.servers = [HubServer("amy", "")]
        hub.read_soon({("amy", "")})  # known: no read
        await asyncio.sleep(0)
        assert hub.reads == 0
        for _ in range(5):  # bo unknown: one read, however many pages ask
            hub.read_soon({("amy", ""), ("bo", "")})
        await asyncio.sleep(0.1)
        assert hub.reads == 1 and ("bo", "") in {(s.user, s.server) for s in hub.servers}
        hub.read_soon({("cy", "")})  # unknown again, but a read started under a second ago
        await asyncio.sleep(0.1)
        assert hub.reads == 1
        hub.soonest = 0.0
        hub.read_soon({("cy", "")})
        await asyncio.sleep(0.1)
        assert hub.reads == 2
        return hub

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("env", "argv", "words"),
    [
        ("{not json", [], "$GPUSHARE_SERVICE_CONFIG is not JSON"),
        ("[1, 2]", [], "must be a JSON object of sections"),
        (
            None,
            ["--config=/nonexistent/service_config.py"],
            "--config /nonexistent/service_config.py: no such file",
        ),
        ('{"GPUShareService": {"slices": [{"slug": "x", "gib": -3}]}}', [], "slices[0]"),
        ('{"GPUShareService": {"gpu_idle_action": "park"}}', [], "gpu_idle_park_profile is empty"),
        ('{"GPUShareService": {"gpu_idle_action": "explode"}}', [], "gpu_idle_action"),
        (
            '{"GPUShareService": {"slices": [{"slug": "t4-5g", "display_name": "5 GiB", "gib": 5}], '
            '"gpu_idle_action": "park", '
            '"gpu_idle_park_profile": "t4-5g"}}',
            [],
            "is a GPU slice of the catalogue",
        ),
        ('{"GPUShareService": {"gpu_idle_action_per_slice": {"t4-9g": "stop"}}}', [], "names t4-9g"),
    ],
)
def test_the_service_refuses_bad_settings_with_a_message_not_a_traceback(
    monkeypatch, capsys, env, argv, words
):
    from gpushare_hub.service.app import main

    if env is None:
        monkeypatch.delenv(CONFIG_ENV, raising=False)
    else:
        monkeypatch.setenv(CONFIG_ENV, env)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("gpushare-hub-service: ") and words in err and "Traceback" not in err, err


def test_the_memory_benchmark_holds_less_in_the_service_than_in_raw_copies_and_shows_every_slice():
    from gpushare_hub.bench.service_memory import bench_service_memory

    out = bench_service_memory(nodes=4, pods=60, holders=6)
    held = out["holders_measured"]
    assert held["service"]["held_mib"] < held["raw copies (the old way)"]["held_mib"]
    assert held["service"]["slices_in_report"] == held["raw copies (the old way)"]["slices_in_report"] == 6


def _usage_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The fixture, with gpu-a's plugin publishing per-pod usage (as UsageReport.annotation writes it)."""
    nodes, pods = fixture_cluster()
    alice = next(p for p in pods if p["metadata"]["name"] == "jupyter-alice")
    card = json.loads(alice["metadata"]["annotations"]["gpushare-hub.io/allocation"])["cards"][0]["uuid"]
    usage = {
        "pods": [
            {"pod": "jhub/jupyter-alice", "uid": "u1", "card": card, "usedMiB": 3174, "sliceMiB": 5120},
            {"pod": "jhub/jupyter-bob", "uid": "u2", "card": card, "usedMiB": 2048, "sliceMiB": 5120},
        ],
        "cards": {card: {"usedMiB": 5222}},
    }
    nodes[0]["metadata"]["annotations"]["gpushare-hub.io/usage"] = json.dumps(usage)
    nodes[0]["metadata"]["annotations"]["gpushare-hub.io/isolation"] = "cooperative"
    return nodes, pods


def test_me_gives_usage_tier_and_neighbours_as_counts_never_their_names():
    nodes, pods = _usage_cluster()
    me = me_of("alice", build_report(read_nodes(nodes), read_pods(pods)), spawn_url="/hub/spawn/alice")
    (mine,) = me["allocations"]
    assert mine["used_mib"] == 3174 and mine["usage_note"] == ""
    assert mine["neighbours"] == {"count": 1, "units": 5, "used_mib": 2048}
    assert mine["isolation"]["tier"] == "cooperative"
    assert mine["isolation"]["words"] == "cooperative limit for the whole server"
    assert mine["card"] == {"model": "Tesla-T4", "units": 15, "used": 10, "free": 5}
    assert me["spawn_url"] == "/hub/spawn/alice"
    text = json.dumps(me)
    assert "bob" not in text and "jupyter-bob" not in text and "big" not in text


def test_me_says_usage_is_not_measured_where_the_node_publishes_none():
    me = me_of("alice")
    (mine,) = me["allocations"]
    assert mine["used_mib"] is None and mine["usage_note"] == "usage not measured on this node"
    assert mine["neighbours"] == {"count": 1, "units": 5, "used_mib": None}


def test_me_offers_the_larger_slices_that_could_start_now():
    nodes, pods = _usage_cluster()
    report = build_report(read_nodes(nodes), read_pods(pods))
    free = {
        "slices": [
            {"slug": "t4-5g", "display_name": "T4 5", "gib": 5, "cards": 1, "placeable": True},
            {"slug": "t4-7g", "display_name": "T4 7", "gib": 7, "cards": 1, "placeable": True},
            {"slug": "t4-12g", "display_name": "T4 12", "gib": 12, "cards": 1, "placeable": False},
        ]
    }
    me = me_of("alice", report, free)
    assert me["larger_free"] == [{"slug": "t4-7g", "display_name": "T4 7", "gib": 7}]
    assert me_of("alice", report, {"slices": []})["larger_free"] == []


def test_configure_hub_tells_servers_where_the_service_is_and_lets_their_tokens_call_it():
    c = Config()
    configure_hub(c, slices=SLICES, port=10101, url="http://hub:10101")
    assert c.GPUShareSpawner.service_url == "http://hub:10101/services/gpushare/"
    server = next(r for r in c.JupyterHub.load_roles if r["name"] == "server")
    assert server["scopes"] == [
        "users:activity!user",
        "access:servers!server",
        "access:services!service=gpushare",
    ]
    assert "server_token_scopes" not in c.Spawner
    own = Config()
    own.JupyterHub.load_roles = [{"name": "server", "scopes": ["users:activity!user", "read:users!user"]}]
    configure_hub(own, slices=SLICES, port=10101)
    server = next(r for r in own.JupyterHub.load_roles if r["name"] == "server")
    assert server["scopes"] == ["users:activity!user", "read:users!user", "access:services!service=gpushare"]
    assert own.GPUShareSpawner.service_url == "http://127.0.0.1:10101/services/gpushare/"


def test_one_me_computation_serves_every_caller_until_the_cluster_changes_or_it_ages():
    from gpushare_hub.service.sources import Cluster

    cluster = Cluster(lambda: None, DEFAULT_NAMES, 30.0)
    made: list[int] = []

    def make() -> int:
        made.append(1)
        return len(made)

    assert cluster.recent("k", make) == 1 and cluster.recent("k", make) == 1
    cluster._on_node("ADDED", read_node(node_obj("gpu-z")))  # an event: the next caller gets a fresh one
    assert cluster.recent("k", make) == 2
    assert cluster.recent("k", make, ttl=0.0) == 3  # too old


def test_each_slice_says_what_it_holds_and_does_and_is_flagged_idle_or_over_from_the_plugins_figures():
    nodes, pods = _usage_cluster()
    usage = json.loads(nodes[0]["metadata"]["annotations"]["gpushare-hub.io/usage"])
    now = int(NOW.timestamp())
    usage["pods"][0].update(usedMiB=6963, smUtil=37, idleSince=None)  # alice: working, past her 5 GiB
    usage["pods"][1].update(usedMiB=600, smUtil=0, idleSince=now - 2400)  # bob: idle 40 min
    nodes[0]["metadata"]["annotations"]["gpushare-hub.io/usage"] = json.dumps(usage)
    report = build_report(read_nodes(nodes), read_pods(pods))
    d = ledger_document(report, SERVERS, read_catalogue(SLICES), NOW, gpu_idle_after=1800)
    by_pod = {a["pod"]: a for a in d["allocations"]}
    alice, bob, carol = by_pod["jupyter-alice"], by_pod["jupyter-bob"], by_pod["jupyter-carol"]
    assert (alice["used_mib"], alice["sm_util"], alice["over_slice"]) == (6963, 37, True)
    assert (alice["gpu_idle_seconds"], alice["gpu_idle"]) == (None, False)
    assert (bob["used_mib"], bob["sm_util"], bob["over_slice"]) == (600, 0, False)
    assert (bob["gpu_idle_seconds"], bob["gpu_idle"]) == (2400, True)
    # carol's card publishes no row for her: nothing held, nothing known of her work
    assert (carol["used_mib"], carol["sm_util"], carol["gpu_idle_seconds"], carol["gpu_idle"]) == (
        0,
        None,
        None,
        False,
    )
    assert d["gpu_idle_after"] == 1800
    later = ledger_document(report, SERVERS, read_catalogue(SLICES), NOW, gpu_idle_after=3600)
    assert not {a["pod"]: a for a in later["allocations"]}["jupyter-bob"]["gpu_idle"]
    # what api/v1/me shows bob of his own slice
    (mine,) = me_of("bob", report)["allocations"]
    assert (mine["gpu_idle_seconds"], mine["gpu_idle"], mine["sm_util"]) == (2400, True, 0)
    # the metrics, per hub user
    text = render_metrics(d, {}, {}, {}).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    idle = {s.labels["user"]: s.value for s in families["gpushare_user_gpu_idle_slices"].samples}
    used = {s.labels["user"]: s.value for s in families["gpushare_user_gpu_memory_used_bytes"].samples}
    over = {s.labels["user"]: s.value for s in families["gpushare_user_slices_over_size"].samples}
    assert idle["bob"] == 1 and idle["alice"] == 0
    assert used["alice"] == 6963 * 2**20 and over == {**over, "alice": 1, "bob": 0}


def test_a_clock_from_the_future_reads_as_idle_for_no_time():
    nodes, pods = _usage_cluster()
    usage = json.loads(nodes[0]["metadata"]["annotations"]["gpushare-hub.io/usage"])
    usage["pods"][1].update(smUtil=0, idleSince=int(NOW.timestamp()) + 600)
    nodes[0]["metadata"]["annotations"]["gpushare-hub.io/usage"] = json.dumps(usage)
    d = ledger_document(
        build_report(read_nodes(nodes), read_pods(pods)), SERVERS, read_catalogue(SLICES), NOW
    )
    bob = next(a for a in d["allocations"] if a["pod"] == "jupyter-bob")
    assert (bob["gpu_idle_seconds"], bob["gpu_idle"]) == (0, False)


def test_per_user_metrics_are_a_bounded_set_the_rest_summed():
    allocations = [
        {
            "hub_user": f"u{i:03d}",
            "units": 1 + (i % 3),
            "used_mib": 100,
            "gpu_idle": i % 2 == 0,
            "over_slice": False,
        }
        for i in range(10)
    ] + [{"hub_user": "", "units": 2, "used_mib": None, "gpu_idle": False, "over_slice": True}]
    rows = per_user({"allocations": allocations}, limit=4)
    assert len(rows) == 4 and OTHERS in rows
    kept = [u for u in rows if u != OTHERS]
    assert all(rows[u]["held"] == 3 for u in kept)  # those holding the most
    assert sum(r["held"] for r in rows.values()) == sum(a["units"] for a in allocations)
    assert sum(r["idle"] for r in rows.values()) == 5 and sum(r["over"] for r in rows.values()) == 1
    assert NO_HUB_USER in per_user({"allocations": allocations})


def test_the_services_own_settings_written_beside_the_spawners_reach_it_and_a_wrong_name_stops_the_hub():
    c = hub_config()
    c.GPUShareService.gpu_idle_after = 7200
    configure_hub(c, port=12345)
    svc = next(s for s in c.JupyterHub.services if s["name"] == "gpushare")
    assert json.loads(svc["environment"][CONFIG_ENV])["GPUShareService"]["gpu_idle_after"] == 7200
    assert (
        json.loads(svc["environment"][CONFIG_ENV])["GPUShareService"]["state_db"] == "gpushare-service.sqlite"
    )
    # Beside the hub's own database when that is a SQLite file (the hub's volume).
    c = hub_config()
    c.JupyterHub.db_url = "sqlite:////srv/jupyterhub/jupyterhub.sqlite"
    configure_hub(c, port=12345)
    svc = next(s for s in c.JupyterHub.services if s["name"] == "gpushare")
    passed = json.loads(svc["environment"][CONFIG_ENV])["GPUShareService"]
    assert passed["state_db"] == "/srv/jupyterhub/gpushare-service.sqlite"
    assert (
        "servers" not in next(r for r in c.JupyterHub.load_roles if r["name"] == "gpushare-service")["scopes"]
    )
    # An idle rule that parks: the service's role may stop and start servers.
    c = hub_config()
    c.GPUShareService.gpu_idle_action_per_group = {"students": "park"}
    configure_hub(c, port=12345)
    assert "servers" in next(r for r in c.JupyterHub.load_roles if r["name"] == "gpushare-service")["scopes"]
    c = hub_config()
    c.GPUShareService.gpu_idle_afterr = 7200
    with pytest.raises(
        ValueError, match=r"c.GPUShareService has no setting gpu_idle_afterr; .*gpu_idle_after"
    ):
        configure_hub(c, port=12345)


def test_configure_hub_passes_the_spawners_budgets_to_the_service_and_points_the_spawner_at_its_book():
    c = hub_config()
    c.GPUShareSpawner.quota_gib_hours_per_group = {"course": 50.0}
    c.GPUShareSpawner.quota_gib_hours_window = "month"
    c.JupyterHub.db_url = "sqlite:////srv/jupyterhub/jupyterhub.sqlite"
    configure_hub(c, port=12345)
    svc = next(s for s in c.JupyterHub.services if s["name"] == "gpushare")
    passed = json.loads(svc["environment"][CONFIG_ENV])["GPUShareService"]
    assert (
        passed["quota_gib_hours_per_group"] == {"course": 50.0}
        and passed["quota_gib_hours_window"] == "month"
    )
    assert c.GPUShareSpawner.budget_db == "/srv/jupyterhub/gpushare-service.sqlite"
    # Budgets stop servers once spent and the grace is over (budget_action "stop" by default).
    assert "servers" in next(r for r in c.JupyterHub.load_roles if r["name"] == "gpushare-service")["scopes"]
    for key, wrong, words in (
        ("quota_gib_hours_timezone", "Mars/Olympus", "is not a time zone"),
        ("quota_gib_hours_window", "year", "use one of day, week, month"),
    ):
        c = hub_config()
        setattr(c.GPUShareSpawner, key, wrong)
        with pytest.raises(ValueError, match=f"c.GPUShareSpawner.{key}.*{words}"):
            configure_hub(c, port=12345)
    c = hub_config()
    c.GPUShareSpawner.quota_gib_hours = 100.0
    c.GPUShareService.budget_action = "notify"
    configure_hub(c, port=12345)
    assert (
        "servers" not in next(r for r in c.JupyterHub.load_roles if r["name"] == "gpushare-service")["scopes"]
    )


def test_me_gives_each_pending_spawn_its_place_and_an_estimate_only_with_history():
    from gpushare_hub.core.releases import Release, ReleaseHistory
    from gpushare_hub.service.handlers.me import add_queue_places

    cluster, informer = fed_cluster()  # dave waits for 16 GiB
    for name, units, created in [("jupyter-erin", 5, "12:00:00"), ("jupyter-fay", 3, "12:00:30"),
                                 ("jupyter-gus", 5, "12:01:00")]:  # fmt: skip
        pod = pod_obj(name, units, annotations={"hub.jupyter.org/username": name[8:]})
        pod["metadata"]["creationTimestamp"] = f"2026-11-22T{created}Z"
        informer.apply("pods", "ADDED", pod)
    report = cluster.report()
    doc = me_of("gus", report)
    history = ReleaseHistory(started=time.monotonic() - 3600)
    add_queue_places(doc, cluster, history)
    [gus] = doc["pending"]
    # erin (5 GiB, older) and dave (16 GiB, older) hold gus back; fay (3 GiB) does not
    assert (gus["pod"], gus["ahead"], gus["estimate"]) == ("jupyter-gus", 2, None)  # no history yet
    for ago in (3000, 1200):
        history.add(Release(time.monotonic() - ago, "Tesla-T4", 7))
    add_queue_places(doc, cluster, history)
    [gus] = doc["pending"]
    assert gus["estimate"]["releases"] == 2 and 4800 <= gus["estimate"]["seconds"] <= 5500, gus
    assert gus["estimate"]["words"].startswith("estimate: about 1 h 30 min (2 such slices were released"), gus
