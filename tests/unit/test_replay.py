"""gpushare-replay on small synthetic traces: figures, JSON contract, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpushare_hub.replay.cli import main

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,65536,2,T4\nn1,8000,65536,2,T4\n"


def write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def pods_csv(tmp: Path, rows: list[str]) -> Path:
    return write(tmp, "pods.csv", HEADER + "".join(r + "\n" for r in rows))


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_dynamic_replay_reports_peak_and_bound(tmp_path, capsys):
    # Three 13-slice pods at once, then two 2-slice pods that fit the holes.
    rows = [f"p{i},1000,1024,1,810,,LS,Running,0,100," for i in range(3)]
    rows += [f"q{i},1000,1024,1,120,,LS,Running,10,50," for i in range(2)]
    out = run_json(capsys, "--pods", str(pods_csv(tmp_path, rows)), "--cards", "4x2 Tesla-T4:15360")
    assert out["peak_cards"] == 3 and out["peak_lower_bound"] == 3 and out["peak_ratio"] == 1.0
    for key in ("peak_cards", "peak_lower_bound", "peak_ratio", "card_hours_ratio", "pods", "seconds"):
        assert key in out
    assert out["units_per_card"] == 15 and out["pods"] == 5


def test_spread_uses_more_cards_than_binpack(tmp_path, capsys):
    rows = [f"p{i},1000,1024,1,200,,LS,Running,{i},1000," for i in range(5)]  # 5 x 3 slices
    csv = str(pods_csv(tmp_path, rows))
    packed = run_json(capsys, "--pods", csv, "--cards", "4x2 T4", "--policy", "binpack")
    spread = run_json(capsys, "--pods", csv, "--cards", "4x2 T4", "--policy", "spread")
    assert packed["peak_cards"] == 1 and spread["peak_cards"] == 5


def test_static_replay_respects_cpu_and_reports_unallocated(tmp_path, capsys):
    nodes = write(tmp_path, "nodes.csv", NODES)
    # Each pod needs 6 of the node's 8 CPUs: only one per node fits, so half the GPU stays unallocated.
    rows = [f"p{i},6000,1024,1,1000,,LS,Running,0,1," for i in range(4)]
    out = run_json(
        capsys,
        "--mode",
        "static",
        "--pods",
        str(pods_csv(tmp_path, rows)),
        "--nodes",
        str(nodes),
        "--inflate",
        "1.0",
    )
    assert out["unallocated_gpu_pct_at_100"] == 50.0
    assert out["failed_pods"] == 2
    assert "no node has the CPU or host memory" in out["failed_reasons"]["by_reason"]


def test_static_mean_over_seeds(tmp_path, capsys):
    nodes = write(tmp_path, "nodes.csv", NODES)
    rows = [f"p{i},100,128,1,{300 + 100 * (i % 5)},,LS,Running,0,1," for i in range(20)]
    out = run_json(
        capsys,
        "--mode",
        "static",
        "--pods",
        str(pods_csv(tmp_path, rows)),
        "--nodes",
        str(nodes),
        "--seeds",
        "3",
        "--policy",
        "fgd",
    )
    assert out["seeds"] == [0, 1, 2] and len(out["unallocated_gpu_pct_at_100_per_seed"]) == 3


@pytest.mark.parametrize(
    "row,where",
    [
        ("p0,1000,1024,1,-5,,LS,Running,0,1,", "row 2, column gpu_milli: -5 is below 0"),
        ("p0,1000,1024,1,lots,,LS,Running,0,1,", "row 2, column gpu_milli: 'lots' is not a whole number"),
        ("p0,1000,1024,1,500,H100,LS,Running,0,1,", "row 2, column gpu_spec: unknown card model(s) H100"),
        ("p0,1000,1024,2,500,,LS,Running,0,1,", "row 2, column gpu_milli: 500 with num_gpu=2"),
    ],
)
def test_bad_rows_name_file_row_and_column(tmp_path, capsys, row, where):
    csv = pods_csv(tmp_path, ["first,1,1,1,100,,LS,Running,0,1,", row])
    plot = tmp_path / "out.png"
    assert main(["--pods", str(csv), "--cards", "1x1 T4", "--plot", str(plot)]) == 2
    err = capsys.readouterr().err
    assert str(csv) in err and where.replace("row 2", "row 3") in err
    assert not plot.exists()  # nothing half-written


def test_missing_column_is_named(tmp_path, capsys):
    csv = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu\np,1,1,1\n")
    assert main(["--pods", str(csv)]) == 2
    assert "row 1 (header) lacks column(s) gpu_milli" in capsys.readouterr().err


def test_unknown_card_model_in_node_list_and_declared_cards(tmp_path, capsys):
    nodes = write(
        tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,1024,2,T4\nn1,8000,1024,2,X9\n"
    )
    csv = str(pods_csv(tmp_path, ["p,1,1,1,100,,LS,Running,0,1,"]))
    assert main(["--mode", "static", "--pods", csv, "--nodes", str(nodes)]) == 2
    assert "row 3, column model: unknown card model 'X9'" in capsys.readouterr().err
    assert main(["--pods", csv, "--cards", "2x2 Quadro"]) == 2
    err = capsys.readouterr().err
    assert "unknown card model 'Quadro'" in err and "Quadro:MiB" in err


def test_dynamic_mode_needs_time_columns(tmp_path, capsys):
    csv = write(tmp_path, "pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,100\n")
    assert main(["--pods", str(csv), "--cards", "1x1 T4"]) == 2
    assert "dynamic mode needs creation_time and deletion_time" in capsys.readouterr().err


def test_plot_is_written(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the plot extra is optional: pip install 'gpushare-hub[plot]'")
    rows = [f"p{i},1000,1024,1,300,,LS,Running,{i * 10},{i * 10 + 300}," for i in range(10)]
    png = tmp_path / "replay.png"
    out = run_json(capsys, "--pods", str(pods_csv(tmp_path, rows)), "--cards", "2x2 T4", "--plot", str(png))
    assert out["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_catalogue_rounds_each_pod_up_to_the_smallest_size_that_holds_it(tmp_path, capsys):
    # Exact slices on a T4 (S = 15): 120 -> 2, 200 -> 3, 400 -> 6, 810 -> 13.
    rows = [f"p{i},1000,1024,1,{m},,LS,Running,0,100," for i, m in enumerate([120, 200, 400, 810])]
    csv = str(pods_csv(tmp_path, rows))
    exact = run_json(capsys, "--pods", csv, "--cards", "4x1 T4")
    assert exact["catalogue"] == [] and exact["peak_cards"] == 2  # 13 | 2+3+6
    # 3,5,7: 2 -> 3, 3 -> 3, 6 -> 7, 13 -> a whole card (15): 13 slices of rounding in all.
    cat = run_json(capsys, "--pods", csv, "--cards", "4x1 T4", "--catalogue", "7,3,5")
    assert cat["catalogue"] == [3, 5, 7] and cat["peak_cards"] == 2  # 15 | 3+3+7
    asked = (120 + 200 + 400 + 810) * 15 / 1000
    assert cat["rounding_overhead_pct"] == round(100 * (28 - asked) / asked, 2)
    # Whole cards for everyone: a catalogue of one size, the card.
    whole = run_json(capsys, "--pods", csv, "--cards", "4x1 T4", "--catalogue", "15")
    assert whole["peak_cards"] == 4 and whole["idle_in_used_cards_pct"] == 0.0
    # The pods ask 24 slices: of 2 cards (30) with exact slices, of 4 cards (60) with whole cards.
    assert (exact["asked_in_used_cards_pct"], whole["asked_in_used_cards_pct"]) == (80.0, 40.0)


def test_idle_memory_of_cards_in_use_is_what_no_pod_holds(tmp_path, capsys):
    rows = ["p0,1000,1024,1,200,,LS,Running,0,100,"]  # 3 of 15 slices, on one card, all the time
    out = run_json(capsys, "--pods", str(pods_csv(tmp_path, rows)), "--cards", "1x1 T4")
    assert (out["idle_in_used_cards_pct"], out["asked_in_used_cards_pct"]) == (80.0, 20.0)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--catalogue", "3,16"], "16 slices is more than a card holds (15)"),
        (["--catalogue", "3,5", "--unit", "milli"], "--catalogue needs --unit slices"),
    ],
)
def test_a_catalogue_that_cannot_be_offered_is_refused(tmp_path, capsys, argv, words):
    csv = str(pods_csv(tmp_path, ["p,1,1,1,100,,LS,Running,0,1,"]))
    assert main(["--pods", csv, "--cards", "1x1 T4", *argv]) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["3,x", "0,5", "3,3", ""])
def test_an_unreadable_catalogue_stops_before_anything_runs(capsys, spec):
    with pytest.raises(SystemExit) as exit_:
        main(["--catalogue", spec])
    assert exit_.value.code == 2 and "--catalogue" in capsys.readouterr().err


def test_a_plot_path_that_cannot_be_written_and_a_binary_trace_are_refused_before_the_replay(
    tmp_path, capsys
):
    csv = str(pods_csv(tmp_path, ["p,1000,1024,1,300,,LS,Running,0,300,"]))
    assert main(["--pods", csv, "--cards", "2x2 T4", "--plot", str(tmp_path / "nope" / "x.png")]) == 2
    assert f"folder {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    binary = tmp_path / "pods.csv.gz"
    binary.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe\x00binary")
    assert main(["--pods", str(binary)]) == 2
    assert "not a text CSV file" in capsys.readouterr().err


def test_a_plot_name_without_a_suffix_is_reported_as_the_png_written(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the plot extra is optional: pip install 'gpushare-hub[plot]'")
    rows = [f"p{i},1000,1024,1,300,,LS,Running,{i * 10},{i * 10 + 300}," for i in range(4)]
    out = run_json(
        capsys, "--pods", str(pods_csv(tmp_path, rows)), "--cards", "2x2 T4", "--plot", str(tmp_path / "out")
    )
    assert out["plot"] == str(tmp_path / "out.png") and (tmp_path / "out.png").exists()


def test_failures_are_counted_by_the_kind_and_reasons_of_the_placers_verdicts():
    from gpushare_hub.core import Demand, Ledger, Node, Placer, Refusal, declared_cards
    from gpushare_hub.replay.simulate import Failures

    ledger = Ledger()
    ledger.set_node(Node("cpu-short", declared_cards("cpu-short", 1, "T4", 15360), cpu_milli=1000))
    ledger.set_node(Node("mem-short", declared_cards("mem-short", 1, "T4", 15360), memory_mib=1000))
    ledger.set_node(Node("plain", declared_cards("plain", 1, "T4", 15360)))
    placer = Placer(ledger)
    for hold, node in [
        (Demand("a/full", 15, 1), "plain"),
        (Demand("a/cpu-held", 1, 1, cpu_milli=500), "cpu-short"),
        (Demand("a/mem-held", 1, 1, memory_mib=500), "mem-short"),
    ]:
        assert not isinstance(placer.place_and_commit(hold, [node]), Refusal)
    failures = Failures()
    for demand, nodes in [
        (Demand("a/host", 5, 1, cpu_milli=800, memory_mib=800), ["cpu-short", "mem-short"]),
        (Demand("a/cpu", 5, 1, cpu_milli=800), ["cpu-short", "plain"]),  # plain: no room
        (Demand("a/big", 16, 1), None),
    ]:
        refusal = placer.decide(demand, nodes)
        assert isinstance(refusal, Refusal)
        failures.add(refusal)
    assert failures.by_kind == {"no node has the CPU or host memory": 1, "no room now": 1, "never fits": 1}
    assert failures.examples["no node has the CPU or host memory"].startswith("pod a/host asks 5 GiB")
