"""``gpushare-selftest``: the verdicts from given runs (pure), then whole runs against the fake torch
in each isolation tier: the hook's cooperative cap, an MPS daemon's limit, a driver's limit, none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpushare_hub.demo.fakegpu import write_site
from gpushare_hub.isolation import selftest
from gpushare_hub.isolation.hookfiles import HOOK_DIR
from gpushare_hub.isolation.probes import WholeServer
from gpushare_hub.isolation.selftest import FrameworkResult, Probe, framework_result, meets, observed_tier

SLICE = 5120


def held(at: int = SLICE) -> Probe:
    return Probe(held_mib=at, stopped=True, oom="CUDA out of memory.")


WENT_PAST = Probe(held_mib=SLICE + 1024, stopped=False)


# ---- verdicts --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("capped", "lifted", "hard", "expected", "tier"),
    [
        # The framework's cap holds; lifted, it gets past: cooperative.
        (held(), WENT_PAST, None, FrameworkResult("torch", True, SLICE, "framework", False), "cooperative"),
        # Lifted, it still stops at the slice where MPS is set up: the MPS limit holds.
        (
            held(),
            held(SLICE - 300),
            "mps",
            FrameworkResult("torch", True, SLICE, "mps", True, lifted_stopped_at_mib=SLICE - 300),
            "mps",
        ),
        (
            held(),
            held(),
            "driver",
            FrameworkResult("torch", True, SLICE, "driver", True, lifted_stopped_at_mib=SLICE),
            "driver",
        ),
        # Lifted, it stops past the slice (the card is full there): still only cooperative.
        (
            held(),
            held(SLICE + 512),
            "mps",
            FrameworkResult("torch", True, SLICE, "framework", False, lifted_stopped_at_mib=SLICE + 512),
            "cooperative",
        ),
        # Nothing stopped the first run: no cap at all.
        (WENT_PAST, None, None, FrameworkResult("torch", False, None, None, False), "none"),
        # Stopped, but past the slice: the slice did not hold.
        (held(SLICE + 256), None, "mps", FrameworkResult("torch", False, SLICE + 256, None, False), "none"),
        # Could not be tried at all.
        (
            Probe(error="ModuleNotFoundError: No module named 'torch'"),
            None,
            None,
            FrameworkResult(
                "torch", False, None, None, None, error="ModuleNotFoundError: No module named 'torch'"
            ),
            None,
        ),
    ],
)
def test_what_two_runs_of_a_framework_show(capped, lifted, hard, expected, tier):
    result = framework_result("torch", SLICE, capped, lifted, hard)
    assert result == expected
    assert result.tier == tier


def test_a_stop_at_the_slice_with_no_hard_cap_set_up_counts_as_cooperative_and_says_why():
    result = framework_result("torch", SLICE, held(), held(SLICE), None)
    assert result.tier == "cooperative" and result.hard_cap_held is None
    assert "no hard cap set up" in (result.note or "") and "the card may be full" in (result.note or "")


def test_a_failed_second_run_leaves_the_first_ones_verdict_with_a_note():
    result = framework_result("torch", SLICE, held(), Probe(error="RuntimeError: boom"), None)
    assert result.held and result.error is None and result.hard_cap_held is None
    assert result.note == "with the cap lifted the run failed: RuntimeError: boom"
    assert result.tier == "cooperative"


def test_the_observed_tier_is_the_weakest_framework_and_unknown_when_nothing_ran():
    coop = framework_result("cupy", SLICE, held(), WENT_PAST, None)
    hard = framework_result("torch", SLICE, held(), held(), "mps")
    none = framework_result("jax", SLICE, WENT_PAST, None, None)
    failed = framework_result("jax", SLICE, Probe(error="x"), None, None)
    assert observed_tier([hard]) == "mps"
    assert observed_tier([hard, coop]) == "cooperative"
    assert observed_tier([hard, coop, none]) == "none"
    assert observed_tier([hard, failed]) == "mps"
    assert observed_tier([failed]) == "unknown" and observed_tier([]) == "unknown"


@pytest.mark.parametrize(
    ("observed", "claimed", "ok"),
    [
        ("cooperative", None, True),
        ("cooperative", "cooperative", True),
        ("mps", "cooperative", True),
        ("driver", None, True),
        ("cooperative", "mps", False),
        ("mps", "mps", True),
        ("driver", "mps", False),
        ("none", None, False),
        ("unknown", "cooperative", False),
    ],
)
def test_the_observed_tier_meets_the_claim(observed, claimed, ok):
    assert meets(observed, claimed) is ok


REQUIRED = {"slice_mib", "card", "claimed_tier", "observed_tier", "ok", "frameworks", "checked"}
FRAMEWORK_KEYS = {"name", "held", "stopped_at_mib", "cap", "hard_cap_held", "error"}


def test_the_json_report_has_its_stable_keys():
    env = {"NVIDIA_VISIBLE_DEVICES": "GPU-1,GPU-2", "GPUSHARE_ISOLATION_TIER": "mps"}
    results = [framework_result("torch", SLICE, held(), WENT_PAST, "mps")]
    doc = selftest.document(SLICE, env, results, datetime(2026, 5, 1, 12, 0, tzinfo=UTC))
    assert set(doc) >= REQUIRED
    assert doc["slice_mib"] == SLICE and doc["card"] == "GPU-1"
    assert doc["claimed_tier"] == "mps" and doc["observed_tier"] == "cooperative" and doc["ok"] is False
    assert doc["checked"] == "2026-05-01T12:00:00Z"
    (torch,) = doc["frameworks"]
    assert set(torch) >= FRAMEWORK_KEYS
    assert (torch["name"], torch["held"], torch["stopped_at_mib"], torch["cap"], torch["hard_cap_held"]) == (
        "torch",
        True,
        SLICE,
        "framework",
        False,
    )
    json.dumps(doc)  # all of it is JSON


def test_a_claimed_tier_that_is_not_one_is_taken_as_unset_and_said():
    doc = selftest.document(SLICE, {"GPUSHARE_ISOLATION_TIER": "steel"}, [], datetime.now(UTC))
    assert doc["claimed_tier"] is None and doc["observed_tier"] == "unknown" and doc["ok"] is False
    assert any("'steel' is not a tier" in n for n in doc["notes"])
    assert any("no GPU framework" in n for n in doc["notes"])


def test_the_human_report_is_a_table_and_a_verdict():
    results = [
        framework_result("torch", SLICE, held(), WENT_PAST, None),
        framework_result("cupy", SLICE, Probe(error="ImportError: libcuda.so.1"), None, None),
    ]
    text = selftest.render(
        selftest.document(SLICE, {"NVIDIA_VISIBLE_DEVICES": "GPU-1"}, results, datetime.now(UTC))
    )
    lines = text.splitlines()
    assert lines[0] == "gpushare-selftest: 5120 MiB slice on GPU-1; tried up to 6144 MiB"
    assert lines[1].split() == [
        "framework",
        "held",
        "stopped",
        "at",
        "cap",
        "cap",
        "lifted:",
        "stopped",
        "at",
    ]
    assert lines[2].split() == ["torch", "yes", "5120", "MiB", "framework", "went", "past", "the", "slice"]
    assert lines[3].split()[:2] == ["cupy", "?"] and "not tried: ImportError: libcuda.so.1" in lines[3]
    assert lines[-1].startswith("verdict: OK: observed cooperative, no tier claimed")


@pytest.mark.parametrize("value", ["", "lots", "-1", "0"])
def test_no_slice_here_exits_2_naming_the_variable(monkeypatch, capsys, value):
    monkeypatch.setenv("GPUSHARE_MEMORY_LIMIT_MIB", value)
    assert selftest.main(["--json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpushare-selftest: GPUSHARE_MEMORY_LIMIT_MIB")
    assert ("is not set" in err) if not value else ("is not a whole number of MiB above 0" in err)


def test_a_bad_step_is_refused_by_the_option(capsys):
    with pytest.raises(SystemExit) as stop:
        selftest.main(["--step-mib", "0"])
    assert stop.value.code == 2 and "give a step from 1 to 65536 MiB" in capsys.readouterr().err


# ---- whole runs against the fake torch ---------------------------------------------------------
def run_selftest(cwd: Path, env: dict[str, str], *args: str, hook: bool = True) -> tuple[int, Any, str]:
    full_env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONDONTWRITEBYTECODE": "1",
        "GPUSHARE_MEMORY_LIMIT_MIB": str(SLICE),
        "GPUSHARE_CARD_MEMORY_MIB": "15360",
        "NVIDIA_VISIBLE_DEVICES": "GPU-test",
        **({"PYTHONPATH": str(HOOK_DIR)} if hook else {}),
        **env,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "gpushare_hub.isolation.selftest", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out: Any = json.loads(proc.stdout) if "--json" in args and proc.stdout.strip() else proc.stdout
    return proc.returncode, out, proc.stderr


@pytest.fixture
def notebook(tmp_path: Path) -> Path:
    """A notebook's working directory with the fake torch in it, as a person would upload it."""
    write_site(tmp_path)
    return tmp_path


def only_torch(doc: dict[str, Any]) -> dict[str, Any]:
    assert [f["name"] for f in doc["frameworks"]] == ["torch"], doc
    return doc["frameworks"][0]  # type: ignore[no-any-return]


def test_with_the_hook_the_fake_torch_holds_at_the_slice_and_the_tier_is_cooperative(notebook):
    status, doc, err = run_selftest(notebook, {}, "--json")
    assert status == 0, err
    torch = only_torch(doc)
    assert (torch["held"], torch["stopped_at_mib"], torch["cap"], torch["hard_cap_held"]) == (
        True,
        SLICE,
        "framework",
        False,
    )
    assert torch["lifted_stopped_at_mib"] is None  # got to the slice + 1 GiB with the cap lifted
    assert doc["observed_tier"] == "cooperative" and doc["claimed_tier"] is None and doc["ok"] is True


def test_a_claimed_mps_tier_is_confirmed_where_the_daemon_enforces_the_pinned_limit(notebook):
    pipe = notebook / "mps-pipe"
    pipe.mkdir()
    env = {
        "GPUSHARE_ISOLATION_TIER": "mps",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={SLICE}M",
        "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
    }
    status, doc, _ = run_selftest(notebook, env, "--json")
    assert status == 1 and doc["observed_tier"] == "none"  # no daemon yet: nothing caps PyTorch
    (pipe / "control").touch()
    status, doc, err = run_selftest(notebook, env, "--json", "--step-mib", "512")
    assert status == 0, err
    torch = only_torch(doc)
    assert (torch["held"], torch["cap"], torch["hard_cap_held"], torch["lifted_stopped_at_mib"]) == (
        True,
        "mps",
        True,
        SLICE,
    )
    assert doc["observed_tier"] == "mps" and doc["ok"] is True


def test_a_claimed_driver_tier_is_not_confirmed_unless_the_driver_enforces_the_limit(notebook):
    env = {"GPUSHARE_ISOLATION_TIER": "driver", "NVIDIA_GPU_MEMORY_LIMITS": str(SLICE)}
    status, doc, _ = run_selftest(notebook, env, "--json")
    assert status == 1 and doc["observed_tier"] == "cooperative" and doc["ok"] is False
    status, doc, _ = run_selftest(notebook, {**env, "FAKE_DRIVER_ENFORCES": "1"}, "--json")
    assert status == 0 and doc["observed_tier"] == "driver" and only_torch(doc)["cap"] == "driver"


def test_without_the_hook_nothing_holds_and_the_report_says_none(notebook):
    status, text, _ = run_selftest(notebook, {}, hook=False)
    assert status == 1
    assert "torch      NO" in text
    assert text.rstrip().splitlines()[-1].startswith("verdict: NOT OK: observed none")


def test_a_child_never_takes_more_than_the_slice_plus_1_gib(notebook, monkeypatch):
    monkeypatch.chdir(notebook)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "GPUSHARE_CARD_MEMORY_MIB": "15360",
        "PYTHONPATH": str(notebook),
    }
    probe = selftest.probe("torch", SLICE + 1024, 300, False, env)
    assert probe == Probe(held_mib=SLICE + 1024, stopped=False)  # the last step is cut to fit


def test_frameworks_are_found_in_the_working_directory_without_being_imported(notebook, tmp_path_factory):
    assert "torch" in selftest.installed_frameworks(str(notebook))
    assert "torch" not in sys.modules
    empty = tmp_path_factory.mktemp("empty")
    assert "torch" not in selftest.installed_frameworks(str(empty))


def test_with_a_container_ledger_the_selftest_checks_the_slice_holds_for_two_processes(notebook, tmp_path):
    """Issue 37: a first PyTorch process holds half the slice, a second stops at what is left."""
    ledger = tmp_path / "tmp" / "gpushare-hub-ledger"  # the notebook's own: the check uses one of its own
    status, doc, _ = run_selftest(notebook, {"GPUSHARE_LEDGER_DIR": str(ledger)}, "--json")
    assert status == 0 and doc["ok"] is True, doc
    assert doc["whole_server"] == {
        "slice_mib": SLICE, "first_mib": SLICE // 2, "second_stopped_at_mib": SLICE // 2, "error": None,
        "held": True,
    }  # fmt: skip
    assert not ledger.exists() or not list(ledger.iterdir())
    status, text, _ = run_selftest(notebook, {"GPUSHARE_LEDGER_DIR": str(ledger)})
    assert "a second stopped at 2560 MiB: the slice holds for all of the server's processes together" in text
    # Without a ledger the caps are per process: nothing to check, and the report says nothing of it.
    status, doc, _ = run_selftest(notebook, {}, "--json")
    assert status == 0 and doc["whole_server"] is None


def test_a_second_process_past_what_the_first_left_is_reported_and_not_ok():
    whole = WholeServer(SLICE, 2560, SLICE)
    assert not whole.held and "a second took 5120 MiB: each process has the whole slice" in whole.words()
    assert (
        WholeServer(SLICE, 2560, None)
        .words()
        .endswith("a second got past the slice: each process has the whole slice")
    )
    failed = WholeServer(SLICE, 0, None, "the first child did not report in 300 s")
    assert not failed.held and failed.words().startswith("the whole server's slice could not be checked")
    doc = selftest.document(SLICE, {}, [selftest.framework_result("torch", SLICE, held(), WENT_PAST, None)],
                            datetime.now(UTC), whole=whole)  # fmt: skip
    assert doc["ok"] is False and doc["whole_server"]["held"] is False
    assert "each process has the whole slice" in selftest.render(doc)
