"""``gpushare-bench startup``: its arguments and the shape of what it prints (figures are never
asserted: they belong to the machine)."""

from __future__ import annotations

import sys

import pytest

from gpushare_hub.bench import main, startup


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--runs", "0"], "argument --runs: 0 is too few; give 1 or more"),
        (["--only", "kubectl-nope"], "--only kubectl-nope: not a console script of gpushare-hub ("),
        (["--kubeconfig", "/nonexistent/kc"], "--kubeconfig /nonexistent/kc: no such file"),
        (["--source", "/nonexistent"], "--source /nonexistent: no gpushare_hub package in it"),
    ],
)
def test_wrong_arguments_are_refused_before_anything_runs(capsys, monkeypatch, argv, words):
    monkeypatch.setattr(startup, "measure", lambda *a: pytest.fail("measured despite a wrong argument"))
    with pytest.raises(SystemExit) as exit_:
        main(["startup", *argv])
    assert exit_.value.code == 2 and words in capsys.readouterr().err


def test_every_console_script_is_run_with_help_after_the_baseline(tmp_path):
    scripts = startup.console_scripts()
    assert {"kubectl-inspect-gpushare", "gpushare-extender", "gpushare-bench"} <= set(scripts)
    kc = str(tmp_path / "kc")
    cmds = startup.commands(kubeconfig=kc)
    assert cmds[0] == startup.Command("python -c pass", (sys.executable, "-c", "pass"))
    assert [c.label for c in cmds[1:-1]] == [f"{s} --help" for s in scripts]
    assert all(c.argv[1:] == ("--help",) for c in cmds[1:-1])
    assert cmds[-1].label == "kubectl-inspect-gpushare --kubeconfig" and cmds[-1].argv[1:] == (
        "--kubeconfig",
        kc,
    )
    only = startup.commands(only=["gpushare-replay"])
    assert [c.label for c in only] == ["python -c pass", "gpushare-replay --help"]


def test_one_run_reads_the_childs_own_figures_and_its_failure():
    ok = startup.run_once((sys.executable, "-c", "pass"))
    assert ok.exit_code == 0 and ok.wall_s > 0 and ok.rss_mib > 0 and ok.floor_mib > 0
    bad = startup.run_once((sys.executable, "-c", "import sys; sys.exit('no cluster to talk to')"))
    assert (bad.exit_code, bad.last_error) == (1, "no cluster to talk to")


def test_the_table_lists_each_command_against_the_baseline():
    figures = [
        startup.Figures(
            startup.Command("python -c pass", ("python",)), [0.02, 0.03, 0.02], [10.0, 10.0, 11.0]
        ),
        startup.Figures(
            startup.Command("kubectl-inspect-gpushare --help", ("k",)), [0.1, 0.12, 0.11], [20.0] * 3
        ),
        startup.Figures(startup.Command("gpushare-extender --help", ("e",)), failed="exit 1: boom"),
    ]
    data = startup.to_json(figures, runs=3)
    inspect = data["commands"][1]
    assert (inspect["median_wall_s"], inspect["wall_x_baseline"], inspect["rss_x_baseline"]) == (
        0.11,
        5.5,
        2.0,
    )
    lines = startup.table(data).splitlines()
    assert lines[0].startswith("start-up of each console script: median of 3 runs in fresh processes")
    assert lines[1].split() == ["COMMAND", "WALL", "s", "x", "BASE", "PEAK", "RSS", "MiB", "x", "BASE"]
    assert lines[2].split() == ["python", "-c", "pass", "0.020", "1.0", "10.0", "1.0"]
    assert lines[3].split() == ["kubectl-inspect-gpushare", "--help", "0.110", "5.5", "20.0", "2.0"]
    assert lines[4].split() == ["gpushare-extender", "--help", "failed"]
    assert lines[5] == "failed: gpushare-extender --help: exit 1: boom"
