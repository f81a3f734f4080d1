"""Packing quality on the real trace. Asserts figures (ratios, percentages), never times."""

from __future__ import annotations

import json

import pytest

from gpushare_hub.replay.cli import default_trace_dir, main

TRACE = default_trace_dir() / "openb_pod_list_default.csv"
pytestmark = pytest.mark.skipif(not TRACE.exists(), reason=f"trace not found at {TRACE}")


def replay(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    with capsys.disabled():  # the figures are the point of a benchmark: show them
        print("\n" + json.dumps(out))
    return out


def test_binpack_dynamic_peak_within_7_percent_of_the_l2_bound(capsys):
    out = replay(capsys, "--policy", "binpack", "--slices-per-card", "15", "--compress", "20")
    assert out["pods"] == 3078 and out["failed_pods"] == 0
    assert out["peak_ratio"] <= 1.07


def test_spread_costs_cards_binpack_saves(capsys):
    packed = replay(capsys, "--policy", "binpack")
    spread = replay(capsys, "--policy", "spread")
    assert spread["peak_cards"] > packed["peak_cards"]


def test_static_binpack_beats_published_best_fit(capsys):
    out = replay(capsys, "--mode", "static", "--policy", "binpack", "--seed", "0")
    assert out["unallocated_gpu_pct_at_100"] < 7.14
