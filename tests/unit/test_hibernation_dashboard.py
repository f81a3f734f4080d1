"""Hibernation on the dashboard, in api/v1/ledger and in the metrics (issue 46, part 4): a node
whose plugin overcommits its cards publishes its book (``gpushare-hub.io/hibernation``); the
service shows each card's held and awake sums and each slice awake or hibernated since when. A
malformed book drops only that part."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpushare_hub.core.catalogueread import read_catalogue
from gpushare_hub.core.hibernated import read_node_hibernation
from gpushare_hub.core.names import HIBERNATION_ANNOTATION
from gpushare_hub.core.overcommit import (
    AWAKE,
    HIBERNATED,
    MAX_BOOK_CHARS,
    Book,
    CardSums,
    Overcommit,
    PodRecord,
    book_annotation,
)
from gpushare_hub.core.report import build_report
from gpushare_hub.service.hubservers import HubServer
from gpushare_hub.service.metrics import render_metrics
from gpushare_hub.service.view import ledger_document, me_document
from tests.objects import read_nodes, read_pods
from tests.support.inspect_cluster import fixture_cluster

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)
NOW_S = int(NOW.timestamp())
CARD = "GPU-sim-gpu-a-0"  # alice's and bob's card: 5 GiB each; carol's 7 GiB are on GPU-sim-gpu-a-1
SLICES = [{"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]}]
SERVERS = [HubServer("alice", "", "2026-11-22T11:00:00Z", "2026-11-22T11:50:00Z")]


def book(alice: str = HIBERNATED, waiting: tuple[str, ...] = ("uid-jupyter-alice",)) -> str:
    """gpu-a's plugin's book, factor 2: alice hibernated 10 minutes ago (and waiting to wake), bob
    awake, both on GPU-sim-gpu-a-0 (15 GiB); GPU-sim-gpu-a-1 is sold whole, nobody hibernated."""
    pods = {
        "uid-jupyter-alice": PodRecord(alice, NOW_S - 600, CARD, 5120),
        "uid-jupyter-bob": PodRecord(AWAKE, NOW_S - 3600, CARD, 5120, quiet_since=NOW_S - 60),
        "uid-jupyter-carol": PodRecord(AWAKE, NOW_S - 3600, "GPU-sim-gpu-a-1", 7168),
    }
    cards = {CARD: CardSums(15360, 5120, 5120), "GPU-sim-gpu-a-1": CardSums(15360, 7168, 0)}
    return book_annotation(Book(pods, {CARD: waiting}), Overcommit(2.0, 65536, 300), cards)


def ledger(annotation: str | None) -> dict[str, Any]:
    nodes, pods = fixture_cluster()
    if annotation is not None:
        nodes[0]["metadata"]["annotations"][HIBERNATION_ANNOTATION] = annotation
    report = build_report(read_nodes(nodes), read_pods(pods))
    return ledger_document(report, SERVERS, read_catalogue(SLICES), NOW)


def cards_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["uuid"]: c for n in doc["nodes"] for c in n["cards"]}


def test_each_card_of_an_overcommitting_node_says_its_held_and_awake_sums_and_who_waits():
    doc = ledger(book())
    cards = cards_of(doc)
    assert cards[CARD]["hibernation"] == {
        "factor": 2.0,
        "real_mib": 15360,
        "held_limit_mib": 30720,
        "held_mib": 10240,
        "awake_mib": 5120,
        "waiting": 1,
    }
    assert cards["GPU-sim-gpu-a-1"]["hibernation"]["awake_mib"] == 7168
    assert cards["GPU-sim-gpu-b-0"]["hibernation"] is None  # gpu-b does not overcommit
    # the existing keys are as before
    assert (cards[CARD]["used"], cards[CARD]["units"], cards[CARD]["free"]) == (10, 15, 5)


def test_each_slice_says_since_when_it_is_hibernated_in_rfc3339_or_null():
    doc = ledger(book())
    by_pod = {a["pod"]: a for a in doc["allocations"]}
    assert by_pod["jupyter-alice"]["hibernated_since"] == "2026-11-22T11:50:00Z"
    assert by_pod["jupyter-bob"]["hibernated_since"] is None
    assert by_pod["jupyter-carol"]["hibernated_since"] is None
    assert all(a["hibernated_since"] is None for a in ledger(None)["allocations"])
    # woken: awake again, the card's awake sum is its held sum
    woke = ledger(book(alice=AWAKE, waiting=()))
    assert all(a["hibernated_since"] is None for a in woke["allocations"])
    assert cards_of(woke)[CARD]["hibernation"]["awake_mib"] == 10240
    assert cards_of(woke)[CARD]["hibernation"]["waiting"] == 0
    # api/v1/me carries the same key for the caller's own slice
    nodes, pods = fixture_cluster()
    nodes[0]["metadata"]["annotations"][HIBERNATION_ANNOTATION] = book()
    me = me_document(build_report(read_nodes(nodes), read_pods(pods)), SERVERS, "alice", NOW, 1800)
    assert me["allocations"][0]["hibernated_since"] == "2026-11-22T11:50:00Z"


def _with(**changes: Any) -> str:
    doc = json.loads(book())
    doc.update(changes)
    return json.dumps(doc)


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        "[]",
        '"x"',
        _with(factor=1),
        _with(factor="2"),
        _with(factor=True),
        _with(factor=99),
        "{" * 100_000,
        " " * 200_000,
    ],
)
def test_a_malformed_or_plain_annotation_drops_only_the_hibernation_part(raw):
    doc = ledger(raw)
    plain = ledger(None)
    assert read_node_hibernation(raw) is None
    assert all(c["hibernation"] is None for c in cards_of(doc).values())
    assert all(a["hibernated_since"] is None for a in doc["allocations"])
    assert [(c["uuid"], c["used"], c["free"]) for c in cards_of(doc).values()] == [
        (c["uuid"], c["used"], c["free"]) for c in cards_of(plain).values()
    ]
    assert doc["warnings"] == plain["warnings"]


def test_odd_parts_of_the_book_drop_only_themselves():
    assert read_node_hibernation(book() + " " * MAX_BOOK_CHARS) is None  # too long to read
    doc = json.loads(book())
    doc["cards"][CARD]["realMiB"] = "15360"  # this card's memory unreadable: no sums for it
    doc["pods"]["uid-jupyter-bob"]["since"] = -5  # bob's record unreadable: awake
    doc["pods"]["uid-nobody"] = {"state": "asleep"}
    doc["line"] = {CARD: ["uid-jupyter-alice", 7, "uid-nobody"]}
    out = ledger(json.dumps(doc))
    cards = cards_of(out)
    assert cards[CARD]["hibernation"] is None
    assert cards["GPU-sim-gpu-a-1"]["hibernation"]["factor"] == 2.0
    by_pod = {a["pod"]: a for a in out["allocations"]}
    assert by_pod["jupyter-alice"]["hibernated_since"] == "2026-11-22T11:50:00Z"
    assert by_pod["jupyter-bob"]["hibernated_since"] is None


def test_the_metrics_give_each_overcommitting_card_its_sums_and_factor_and_count_the_hibernated():
    text = render_metrics(ledger(book()), {}, {}, {}).decode()
    fam = {f.name: f for f in text_string_to_metric_families(text)}
    held = {s.labels["card"]: s.value for s in fam["gpushare_card_held_mib"].samples}
    awake = {s.labels["card"]: s.value for s in fam["gpushare_card_awake_mib"].samples}
    factor = {s.labels["card"]: s.value for s in fam["gpushare_card_overcommit_factor"].samples}
    assert held == {CARD: 10240, "GPU-sim-gpu-a-1": 7168}
    assert awake == {CARD: 5120, "GPU-sim-gpu-a-1": 7168}
    assert factor == {CARD: 2.0, "GPU-sim-gpu-a-1": 2.0}
    (sample,) = fam["gpushare_card_held_mib"].samples[:1]
    assert set(sample.labels) == {"node", "card", "index", "model"} and sample.labels["node"] == "gpu-a"
    assert [s.value for s in fam["gpushare_hibernated_slices"].samples] == [1]
    plain = {
        f.name: f for f in text_string_to_metric_families(render_metrics(ledger(None), {}, {}, {}).decode())
    }
    assert not plain["gpushare_card_held_mib"].samples  # no series where no node overcommits
    assert [s.value for s in plain["gpushare_hibernated_slices"].samples] == [0]


def _page_script() -> str:
    html = (ROOT / "gpushare_hub/service/static/dashboard.html").read_text()
    script = html.split('<script>\n"use strict";', 1)[1]
    wanted = (
        "function duration(",
        "function gib(",
        "function cardHibernation(",
        "function hibernationState(",
    )
    out = []
    for head in wanted:
        start = script.index(head)
        end = script.index("\n}\n", start) + 3
        out.append(script[start:end])
    return "\n".join(out)


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (the hub tier's proxy needs it too)")
def test_the_page_says_each_card_and_slice_in_words():
    doc = ledger(book())
    card = cards_of(doc)[CARD]
    alice, bob = (a for a in card["allocations"] if a["pod"] in ("jupyter-alice", "jupyter-bob"))
    now = "Date.parse('2026-11-22T12:00:00Z')"
    script = (
        _page_script()
        + f"\nconst card = {json.dumps(card['hibernation'])};"
        + f"\nconst alice = {json.dumps(alice)}, bob = {json.dumps(bob)};"
        + f"\nconsole.log(JSON.stringify([cardHibernation(card), hibernationState(alice, {now}),"
        + f" hibernationState(bob, {now})]));"
    )
    out = subprocess.run(
        ["node", "-e", script], capture_output=True, text=True, timeout=30, check=True, env={"TZ": "UTC"}
    )
    assert json.loads(out.stdout) == [
        "overcommit ×2 · held 10 / 30 GiB · awake 5 / 15 GiB · 1 waiting to wake",
        "hibernated since 11:50 (10 min)",
        "awake",
    ]
