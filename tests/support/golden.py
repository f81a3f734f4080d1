"""The hub service's ``api/v1/me`` document as the service's own code writes it, for the tests of
its readers (the start-up hook's out-of-memory note, the notebook server extension, the
JupyterLab status bar): they load tests/support/golden/me.json through :func:`golden_me`, and
copy, then change, only the fields a test needs otherwise; tests/unit/test_golden_me.py fails
when the service's code no longer writes that file.

:func:`me_document_golden` builds it with the code ``MeHandler`` runs
(:func:`~gpushare_hub.service.handlers.me.availability_of` and
:func:`~gpushare_hub.service.handlers.me.me_answer`, over the service's own ``Cluster`` fed the
objects below, a ledger document, the idle and budget policies and the release history),
with fixed clocks. The state: alice holds a 5 GiB slice (t4-5g) on a Tesla T4, idle on the GPU
long enough to be warned that it will be parked (10 min left); bob and carol share her card
(8 GiB, 2 GiB in use); a 7 GiB and a 10 GiB slice could start now on the node's other card; her
named server ``big`` waits for a whole card (15 GiB) behind dave's older spawn, with an estimate
from two such releases; her 100 GiB·h weekly budget is not spent; and yesterday evening's
server ``old`` was parked for being idle.

After a change to the document, rewrite the file and review its diff::

    GPUSHARE_WRITE_GOLDEN=1 .venv/bin/pytest tests/unit/test_golden_me.py
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpushare_hub.accounting.book import Book
from gpushare_hub.accounting.records import IdleAction
from gpushare_hub.core import DEFAULT_NAMES
from gpushare_hub.core.cards import declared_cards
from gpushare_hub.core.catalogue import Catalogue
from gpushare_hub.core.catalogueread import read_catalogue
from gpushare_hub.core.names import (
    DEVICE_MODE_ANNOTATION,
    HUB_SERVER_ANNOTATION,
    HUB_USER_ANNOTATION,
    ISOLATION_ANNOTATION,
    ISOLATION_CHECK_ANNOTATION,
    SLICE_ANNOTATION,
    USAGE_ANNOTATION,
)
from gpushare_hub.core.releases import Release, ReleaseHistory
from gpushare_hub.service.budgets import BudgetPolicy, BudgetRule
from gpushare_hub.service.enforcement import Enforcement
from gpushare_hub.service.handlers.me import availability_of, me_answer, spawn_url
from gpushare_hub.service.held import held_now, held_slices
from gpushare_hub.service.hubservers import HubServer
from gpushare_hub.service.idle import PARK, IdleRule
from gpushare_hub.service.idlepolicy import IdlePolicy
from gpushare_hub.service.overslice import STOP, OverSlicePolicy, OverSliceRule
from gpushare_hub.service.sources import Cluster, service_informer
from tests.support.inspect_cluster import placed
from tests.unit.helpers import node_obj, pod_obj

GOLDEN_ME = Path(__file__).with_name("golden") / "me.json"
WRITE_ENV = "GPUSHARE_WRITE_GOLDEN"
REWRITE = f"{WRITE_ENV}=1 .venv/bin/pytest tests/unit/test_golden_me.py"

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)  # a Thursday
NOW_S = int(NOW.timestamp())
MONOTONIC = 100_000.0  # the release history's clock at NOW
USER, GROUPS = "alice", ["students"]
NAMESPACE, NODE = "jhub", "nb-1"
GPU_IDLE_AFTER = 1800
IDLE_RULE = IdleRule(action=PARK, return_after=7200, warn_before=600, keep_seconds=3600, park_profile="cpu")
BUDGET_RULE = BudgetRule(per_user=100.0, window="week", action=PARK, park_profile="cpu")
OVER_SLICE_RULE = OverSliceRule(STOP, after=300, warn_before=300)
SLICES = [
    {"slug": f"t4-{gib}g", "display_name": f"Tesla T4 · {gib} GiB", "gib": gib, "models": ["Tesla-T4"]}
    for gib in (3, 5, 7, 10, 15)
]
SERVERS = [
    HubServer(USER, "", "2026-11-26T09:00:30Z", "2026-11-26T10:05:00Z"),
    HubServer("bob", "", "2026-11-26T08:30:30Z", "2026-11-26T11:59:00Z"),
    HubServer("carol", "", "2026-11-26T11:00:30Z", "2026-11-26T11:58:00Z"),
    HubServer("erin", "", "2026-11-26T10:30:30Z", "2026-11-26T11:57:00Z"),
]


def _at(hhmmss: str) -> str:
    return f"2026-11-26T{hhmmss}Z"


def _holder(name: str, user: str, slice_gib: int, idx: int, created: str) -> dict[str, Any]:
    """A running server's pod holding a slice of card ``idx`` of nb-1 (KubeSpawner's annotations)."""
    pod = placed(name, slice_gib, NODE, idx, user, "")
    pod["metadata"]["annotations"][SLICE_ANNOTATION] = f"t4-{slice_gib}g"
    pod["metadata"]["creationTimestamp"] = _at(created)
    pod["status"]["startTime"] = _at(created[:-2] + "20")
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": _at(created[:-2] + "05")}
    ]
    return pod


def _waiting(name: str, user: str, server: str, slice_gib: int, created: str) -> dict[str, Any]:
    """A spawn the scheduler could not place yet."""
    ann = {HUB_USER_ANNOTATION: user, HUB_SERVER_ANNOTATION: server, SLICE_ANNOTATION: f"t4-{slice_gib}g"}
    pod = pod_obj(name, slice_gib, annotations=ann)
    pod["metadata"]["creationTimestamp"] = _at(created)
    pod["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": f"0/1 nodes are available: 1 no card has {slice_gib} GiB free.",
        }
    ]
    return pod


def golden_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """nb-1 (two Tesla T4 cards, usage and a passed self-test published by its plugin) and the pods."""
    pods = [
        _holder("jupyter-alice", USER, 5, 0, "09:00:00"),
        _holder("jupyter-bob", "bob", 5, 0, "08:30:00"),
        _holder("jupyter-carol", "carol", 3, 0, "11:00:00"),
        _holder("jupyter-erin", "erin", 3, 1, "10:30:00"),
        _waiting("jupyter-dave", "dave", "", 15, "11:40:00"),
        _waiting("jupyter-alice--big", USER, "big", 15, "11:55:00"),
    ]
    uuid0, uuid1 = (card.uuid for card in declared_cards(NODE, 2, "Tesla T4", 15360))  # as placed's

    def use(pod: str, card: str, gib: int, used: int, sm: int, idle_since: int | None) -> dict[str, Any]:
        return {
            "pod": f"{NAMESPACE}/{pod}",
            "uid": f"uid-{pod}",
            "card": card,
            "usedMiB": used,
            "sliceMiB": gib * 1024,
            "smUtil": sm,
            "idleSince": idle_since,
        }

    usage = {
        "pods": [
            use("jupyter-alice", uuid0, 5, 590, 0, NOW_S - 6600),  # an idle CUDA context, 1 h 50 min
            use("jupyter-bob", uuid0, 5, 1536, 41, None),
            use("jupyter-carol", uuid0, 3, 512, 12, None),
            use("jupyter-erin", uuid1, 3, 700, 5, None),
        ],
        "cards": {uuid0: {"usedMiB": 2638}, uuid1: {"usedMiB": 700}},
    }
    check = {
        "claimed": "cooperative",
        "observed": "cooperative",
        "ok": True,
        "checked": "2026-11-26T06:00:00Z",
        "detail": "",
    }
    node = node_obj(NODE)
    node["metadata"]["annotations"].update(
        {
            USAGE_ANNOTATION: json.dumps(usage),
            ISOLATION_ANNOTATION: "cooperative",
            ISOLATION_CHECK_ANNOTATION: json.dumps(check),
            DEVICE_MODE_ANNOTATION: "cdi",
        }
    )
    return [node], pods


@dataclass
class GoldenService:
    """What ``MeHandler`` reads of the running service (``RunningService``), with fixed clocks."""

    catalogue: Catalogue
    book: Book
    idle_rule: IdleRule = IDLE_RULE
    budget_rule: BudgetRule = BUDGET_RULE
    node_selector: dict[str, Any] = field(default_factory=dict)
    gpu_idle_after: int = GPU_IDLE_AFTER
    enforcement: Enforcement = field(init=False)
    idle: IdlePolicy = field(init=False)
    budgets: BudgetPolicy = field(init=False)
    over: OverSlicePolicy = field(init=False)
    releases: ReleaseHistory = field(init=False)

    def __post_init__(self) -> None:
        self.enforcement = Enforcement(
            self.book, self.idle_rule, self.budget_rule, None, clock=lambda: NOW_S, over_slice=OVER_SLICE_RULE
        )
        self.idle, self.budgets = self.enforcement.idle, self.enforcement.budgets
        self.over = self.enforcement.over
        self.releases = ReleaseHistory(started=MONOTONIC - 7200, min_span=600)


def me_document_golden(idle_rule: IdleRule = IDLE_RULE) -> dict[str, Any]:
    """``api/v1/me`` for alice, made by the service's own code on :func:`golden_cluster`
    (``idle_rule``: another idle rule's document, for the tests of that rule)."""
    cluster = Cluster(lambda: service_informer(None, DEFAULT_NAMES), DEFAULT_NAMES, 30.0, {NAMESPACE})
    informer = cluster._subscribed()  # what SharedLedger starts; fed by hand below (no API server)
    nodes, pods = golden_cluster()
    for node in nodes:
        informer.apply("nodes", "ADDED", node)
    for pod in pods:
        informer.apply("pods", "ADDED", pod)
    informer.synced = True  # as after its first list: cluster.ledger() answers
    cluster.shared.informer = informer
    svc = GoldenService(read_catalogue(SLICES), Book(":memory:"), idle_rule)
    try:
        for ago in (5400, 1800):  # two whole Tesla T4 cards came free in the last 2 h
            svc.releases.add(Release(MONOTONIC - ago, "Tesla-T4", 15))
        # Yesterday evening: alice's server "old" was parked after 2 h idle on the GPU.
        parked = IdleAction(USER, "old", "s-old", "parked", "t4-5g", 5, NOW_S - 15 * 3600, 7300, "cpu")
        svc.book.record_idle(parked)
        # The service's pass has seen what is held now (from its bind: about 3 h for alice).
        svc.book.observe(held_now(held_slices(cluster.report(), SERVERS), NOW_S), NOW_S, 90.0)
        free = availability_of(svc, cluster, GROUPS, NOW)  # type: ignore[arg-type]
        return me_answer(
            svc,  # type: ignore[arg-type]
            cluster,
            SERVERS,
            free,
            USER,
            GROUPS,
            spawn_url(USER, "/"),
            now=NOW_S,
            monotonic=MONOTONIC,
        )
    finally:
        svc.book.close()


def golden_text(doc: dict[str, Any]) -> str:
    """The file's text: pretty-printed, keys sorted."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def golden_me() -> dict[str, Any]:
    """A fresh copy of tests/support/golden/me.json (change it freely)."""
    doc: dict[str, Any] = json.loads(GOLDEN_ME.read_text(encoding="utf-8"))
    return doc
