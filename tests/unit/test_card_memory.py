"""Issue 47, part 1: what of a slice its frameworks can hold (core/cardmemory.py), what Allocate
tells the start-up hook, and the hook counting each process's CUDA context in the container ledger,
so that every slice of a full card gets what its caps allow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpushare_hub.core import cardmemory
from gpushare_hub.core.cards import Card
from gpushare_hub.core.catalogueread import read_catalogue
from gpushare_hub.plugin.matching import Waiting
from gpushare_hub.plugin.nodeconfig import NodeConfigError, options_for
from gpushare_hub.plugin.response import Isolation, container_response
from tests.conftest import wait_for
from tests.support.isolation import hooked_env

MIB = 1024**2
T4 = Card(0, "GPU-t4", "Tesla-T4", 15, 15360)


def test_a_t4_gives_cuda_15110_mib_and_each_5_gib_slice_a_third_of_it():
    assert cardmemory.cuda_mib("Tesla-T4", 15360) == cardmemory.cuda_mib("tesla t4", 15360) == 15110
    assert cardmemory.cuda_mib("NVIDIA H200", 143771) == 143155
    assert cardmemory.cuda_mib("A10", 23028) == int(23028 * 0.98)  # not measured: 2 % kept back
    usable = cardmemory.usable_mib(5120, 15360, 15110)
    assert usable == 5036 and 3 * usable <= 15110  # three slices fit what CUDA gives
    assert cardmemory.usable_mib(5120, 15360, 15360) == 5120  # no reserve: the slice
    assert cardmemory.framework_mib(5120, "Tesla-T4", 15360) == 5036 - cardmemory.CONTEXT_MIB == 4476


def test_the_form_says_what_pytorch_gets():
    catalogue = read_catalogue(
        [
            {"slug": "t4-5g", "display_name": "T4 5", "gib": 5, "models": ["Tesla-T4"]},
            {"slug": "any-3g", "display_name": "any 3", "gib": 3},
            {"slug": "whole", "display_name": "whole", "gib": None, "models": ["Tesla-T4"]},
        ]
    )
    words = {s.slug: s.usable_words for s in catalogue.slices}
    assert words["t4-5g"] == "PyTorch gets about 4.3 GiB of it (the rest holds the CUDA context)"
    assert words["any-3g"].startswith(
        "PyTorch gets the slice less the card's driver reserve and about 0.55 GiB"
    )
    assert words["whole"] == ""


def test_allocate_tells_the_hook_the_cards_cuda_memory_and_the_context_allowance():
    slice_ = Waiting("jhub/nb", "uid-nb", "notebook", T4.uuid, 5, 5, 1)
    env = container_response(slice_, T4, 1024, Isolation()).envs
    assert env["GPUSHARE_MEMORY_LIMIT_MIB"] == "5120"  # the slice as sold stays
    assert env[cardmemory.CARD_CUDA_ENV] == "15110" and env[cardmemory.CONTEXT_ENV] == "560"
    env = container_response(slice_, T4, 1024, Isolation(context_mib=300)).envs
    assert env[cardmemory.CONTEXT_ENV] == "300"


def test_context_mib_is_a_node_option_checked_as_a_whole_number():
    assert options_for("gpu-1", {"gpu-1": '{"contextMiB": 400}'}, "cm") == {"contextMiB": 400}
    with pytest.raises(NodeConfigError, match="contextMiB must be a whole number"):
        options_for("gpu-1", {"gpu-1": '{"contextMiB": "lots"}'}, "cm")


def test_a_card_sold_as_set_or_refused_naming_the_node_and_the_fix():
    assert cardmemory.sell_problem("gpu-1", [T4], 0.0, 1024, 560) is None
    none_left = Card(0, "GPU-t4", "Tesla-T4", 0, 15360)
    problem = cardmemory.sell_problem("gpu-7", [none_left], 0.95, 1024, 560)
    assert problem == (
        "node gpu-7: card 0 (Tesla-T4, 15360 MiB) keeps no slice to sell with reserveFraction 0.95 "
        "(not even 1024 MiB is left); lower reserveFraction in the node's options to at most 0.93"
    )
    problem = cardmemory.sell_problem("gpu-7", [T4], 0.0, 1024, 1200)
    assert problem is not None and problem.startswith(
        "node gpu-7: contextMiB 1200 leaves a slice of one unit"
    )
    assert "give less than 1007" in problem
    problem = cardmemory.sell_problem("gpu-7", [T4], 0.0, 1024, 99999)
    assert problem is not None and "outside 0 to 8192" in problem


# Holds GIB GiB, says so, and keeps it until its standard input closes.
HOLDER = """
import sys, torch
held = torch.empty({gib} * 1024**3, dtype=torch.uint8, device="cuda")
print("held", flush=True)
sys.stdin.readline()
"""
# Asks MiB in turn; prints took/refused for each.
ASKER = """
import torch
kept = []
for mib in {asks}:
    try:
        kept.append(torch.empty(mib * 1024**2, dtype=torch.uint8, device="cuda"))
        print("took", mib, flush=True)
    except torch.cuda.OutOfMemoryError:
        print("refused", mib, flush=True)
"""


def test_the_hook_counts_each_processs_context_so_two_processes_stay_inside_cudas_part(tmp_path: Path):
    """A 5 GiB slice of a T4, as Allocate tells it: 5036 MiB of CUDA's memory for the server, 560
    MiB per process kept for its context. A process holding 3 GiB counts 3 GiB + 560 MiB; the next
    one may take 5036 - 3632 - 560 = 844 MiB, and the card (contexts of 522 MiB modelled) never
    sees the slice's processes pass their part of it."""
    ledger = tmp_path / "ledger"
    env = hooked_env(
        tmp_path,
        ledger,
        **{cardmemory.CARD_CUDA_ENV: "15110", cardmemory.CONTEXT_ENV: "560"},
        FAKE_TOTAL_MIB="15110",
        FAKE_CONTEXT_MIB="522",
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(gib=3)], env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout and holder.stdout.readline().strip() == "held", holder.stderr
        entry = ledger / f"{holder.pid}.json"
        assert wait_for(
            lambda: entry.exists() and json.loads(entry.read_text())["held"] == 3 * 1024 * MIB + 560 * MIB,
            10,
            every=0.1,
        ), entry.read_text() if entry.exists() else "no entry"
        asker = subprocess.run(
            [sys.executable, "-c", ASKER.format(asks=[900, 840])], env=env, capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        assert asker.stdout.split("\n")[:2] == ["refused 900", "took 840"], (asker.stdout, asker.stderr)
    finally:
        holder.communicate(timeout=10)


def test_the_slice_page_says_what_pytorch_may_hold():
    from gpushare_hub.notebook.sliceinfo import as_json, read_slice

    env = {
        "NVIDIA_VISIBLE_DEVICES": "GPU-t4",
        "GPUSHARE_MEMORY_LIMIT_MIB": "5120",
        "GPUSHARE_CARD_MEMORY_MIB": "15360",
        cardmemory.CARD_CUDA_ENV: "15110",
        cardmemory.CONTEXT_ENV: "560",
        "PYTHONPATH": "/opt/gpushare-hub/pyhook",
    }
    info = read_slice(env)
    assert info.torch_cap_mib == 4476 and as_json(info)["card_cuda_mib"] == 15110
    assert info.summary().endswith("PyTorch capped at 29.6%")
