"""The benchmark commands run and keep their JSON contract (keys that tools read)."""

from __future__ import annotations

import json

from gpushare_hub.bench import main


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    with capsys.disabled():
        print("\n" + json.dumps(out))
    return out


def test_extender_bench_reports_latency_and_throughput(capsys):
    out = run_json(capsys, "extender", "--nodes", "100", "--requests", "50", "--threads", "2")
    for key in ("filter_p99_ms", "prioritize_p99_ms", "bind_p99_ms", "requests_per_s"):
        assert isinstance(out[key], float) and out[key] > 0
    assert out["nodes"] == 100 and out["bind_excludes_api_server"] is True


def test_schedule_bench_compares_with_and_without_the_extender(capsys):
    out = run_json(capsys, "schedule", "--nodes", "20", "--pods", "40", "--timeout", "120")
    for key in ("pods_per_s_with_extender", "pods_per_s_without", "ratio"):
        assert isinstance(out[key], float) and out[key] > 0
    assert out["nodes"] == 20 and out["pods"] == 40


def test_plugin_bench_reports_allocate_latency_and_a_small_list_and_watch(capsys):
    out = run_json(capsys, "plugin", "--requests", "50")
    assert isinstance(out["allocate_p99_ms"], float) and out["allocate_p99_ms"] > 0
    assert out["devices"] == 640
    assert out["list_and_watch_bytes"] < out["kubelet_limit_bytes"] < out["list_and_watch_bytes_mib_unit"]


def test_spawn_bench_reports_spawn_to_ready_and_the_scheduling_share(capsys):
    out = run_json(capsys, "spawn", "--spawns", "2")
    assert out["spawns"] == 2 and len(out["spawn_to_ready_s"]) == 2
    assert out["median_spawn_to_ready_s"] > out["median_scheduling_and_bind_s"] > 0
    assert 0 < out["scheduling_and_bind_share"] < 1


def test_form_bench_reports_render_time_with_a_large_ledger(capsys):
    out = run_json(capsys, "form", "--nodes", "200", "--renders", "20")
    for key in ("cold_render_ms", "form_render_p50_ms", "form_render_p99_ms"):
        assert isinstance(out[key], float) and out[key] > 0
    assert out["nodes"] == 200 and out["slices"] == 4 and out["form_bytes"] > 0
