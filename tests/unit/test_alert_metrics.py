"""The hub service's metrics that the chart's alert rules read: a node whose isolation check
failed, and how long the longest-waiting GPU spawn has waited."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpushare_hub.service.metrics import render_metrics
from gpushare_hub.service.waiting import longest_pending_seconds

pytestmark = pytest.mark.unit


def node(name: str, check: dict[str, Any] | None) -> dict[str, Any]:
    return {"name": name, "problem": "", "cards": [], "isolation": {"check": check}}


def doc(nodes: list[dict[str, Any]], pending: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "unit": "GiB",
        "generated": "2026-11-27T12:00:00Z",
        "nodes": nodes,
        "allocations": [],
        "pending": pending,
        "models": {},
        "fragmentation": {"units": 0},
    }


def pod(name: str, since: str) -> dict[str, Any]:
    return {"namespace": "jhub", "pod": name, "hub_user": "", "since": since}


def samples(d: dict[str, Any]) -> dict[str, list[Any]]:
    text = render_metrics(d, {}, {}, {}).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_a_node_whose_check_did_not_confirm_its_claim_is_flagged_and_the_others_are_not():
    nodes = [
        node("gpu-a", {"claimed": "mps", "observed": "cooperative", "ok": False}),
        node("gpu-b", {"claimed": "mps", "observed": "mps", "ok": True}),
        node("gpu-c", None),  # no check published: nothing said
    ]
    got = {
        (s.labels["node"], s.labels["claimed"]): s.value
        for s in samples(doc(nodes, []))["gpushare_node_isolation_check_failed"]
    }
    assert got == {("gpu-a", "mps"): 1, ("gpu-b", "mps"): 0}


def test_the_longest_wait_is_the_oldest_pending_pods_and_zero_when_none_waits():
    waiting = [pod("a", "2026-11-27T11:40:00Z"), pod("b", "2026-11-27T11:55:00Z"), pod("c", "")]
    assert longest_pending_seconds(doc([], waiting)) == 1200
    (s,) = samples(doc([], waiting))["gpushare_pending_longest_seconds"]
    assert s.value == 1200
    assert longest_pending_seconds(doc([], [])) == 0
    assert longest_pending_seconds(doc([], [pod("future", "2026-11-27T13:00:00Z")])) == 0
