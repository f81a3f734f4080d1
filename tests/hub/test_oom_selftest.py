"""Issue 22, hub tier: in a 5 GiB notebook spawned through the real hub (GPUShareSpawner, the
catalogue's ``t4-5g``), PyTorch's out-of-memory error explains itself, and ``gpushare-selftest``
reports the slice held cooperatively.

The torch is the fake of :mod:`gpushare_hub.demo.fakegpu`, uploaded into the notebook's working
directory through the Contents API as a person would upload files. A kernel holds 3 GiB through
it (the fake claims them where the node's simulated device plugin reads usage), waits until the
hub service's ``api/v1/me`` reports them, then asks for 3 GiB more: the error keeps its type,
``except torch.cuda.OutOfMemoryError`` still catches it, and the traceback the user reads ends
with the start-up hook's note, whose facts are checked against ``api/v1/me`` as the test reads it.
A neighbour holding a slice on the cluster's cards makes the note's "other holders" count.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from gpushare_hub.core import cardmemory
from gpushare_hub.demo.fakegpu import write_site
from gpushare_hub.isolation.selftest import DEFAULT_STEP_MIB
from gpushare_hub.localcluster.hub import LocalHub
from tests.support.hub_helpers import SERVICE, Kernel, start_server, stop_server
from tests.support.isolation import upload

SLICE_GIB = 5
HOLD_GIB = 3
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
NOTE = "gpushare-hub: this server's GPU slice is"


def my_allocation(hub: LocalHub, token: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    status, me = hub.request("GET", f"{hub.url}/services/{SERVICE}/api/v1/me", token)
    assert status == 200, (status, me)
    return me, next((a for a in me.get("allocations", []) if a.get("server", "") == ""), None)


def wait_for_usage(hub: LocalHub, token: str, mib: int, timeout: float = 150) -> dict[str, Any]:
    """``api/v1/me`` once it reports at least ``mib`` MiB in use by the user's server (the claim,
    read by the node's plugin at its next usage reading, published on the Node, read by the service)."""
    deadline = time.monotonic() + timeout
    me: dict[str, Any] = {}
    while time.monotonic() < deadline:
        me, mine = my_allocation(hub, token)
        if mine is not None and isinstance(mine.get("used_mib"), int) and mine["used_mib"] >= mib:
            return me
        time.sleep(2)
    raise AssertionError(f"api/v1/me never reported {mib} MiB in use by the server; last answer: {me}")


def size(mib: int) -> str:
    """The note's way of writing a size."""
    return (f"{mib / 1024:.2f}".rstrip("0").rstrip(".") + " GiB") if mib >= 1024 else f"{mib} MiB"


def check_note(note: str, me: dict[str, Any], neighbour: str) -> None:
    """The note's facts against ``api/v1/me``: the slice, the cap, this process, the other holders,
    the way out. A missing key of the documented shape fails here by name."""
    mine = next(a for a in me["allocations"] if a.get("server", "") == "")
    for key in ("neighbours", "isolation", "used_mib"):
        assert key in mine, f"api/v1/me's allocation lacks {key!r}: {mine}"
    for key in ("larger_free", "spawn_url"):
        assert key in me, f"api/v1/me lacks {key!r}: {me}"
    assert note.startswith(f"{NOTE} {SLICE_GIB} GiB (t4-5g) of a 15 GiB card."), note
    words = mine["isolation"]["words"]
    assert (
        "This allocation would take the process past its slice; PyTorch's per-process fraction set by "
        f"gpushare-hub's start-up hook ({words}) stopped it." in note
    ), note
    assert f"This process holds {HOLD_GIB} GiB and asked for {HOLD_GIB} GiB more." in note, note
    assert f"All processes of this server use {size(mine['used_mib'])} of the card." in note, note
    n = mine["neighbours"]
    if n["count"] == 0:
        assert "No other server holds a slice of this card." in note, note
    else:
        servers = f"{n['count']} server{'s' if n['count'] != 1 else ''}"
        others = f"The card's other holders: {servers} with {n['units']} GiB of slices in all"
        others += f", using {size(n['used_mib'])} now." if isinstance(n["used_mib"], int) else "."
        assert others in note, (note, n)
    assert neighbour not in note  # counts and totals only, never who
    if me["larger_free"]:
        first = me["larger_free"][0]["display_name"]
        assert f"a larger slice that is free now: {first}" in note, (note, me["larger_free"])
    else:
        assert "no larger slice is free now" in note, note
    assert f"on the hub's spawn page ({me['spawn_url']})" in note, note


HOLD = f"""
import os, torch
held = torch.empty({HOLD_GIB} * 1024**3, dtype=torch.uint8, device="cuda")
print("held", torch.cuda.memory_reserved() >> 20, "MiB on", os.environ.get("NVIDIA_VISIBLE_DEVICES"))
print("service", os.environ.get("GPUSHARE_SERVICE_URL"))
"""
PAST_THE_SLICE = f'more = torch.empty({HOLD_GIB} * 1024**3, dtype=torch.uint8, device="cuda")'
CATCH = f"""
try:
    {PAST_THE_SLICE}
except torch.cuda.OutOfMemoryError as err:
    print("caught", type(err).__name__, isinstance(err, RuntimeError))
"""
SELFTEST = """
del held
torch.cuda.empty_cache()
import subprocess
proc = subprocess.run(["gpushare-selftest", "--json"], capture_output=True, text=True, timeout=300)
print("SELFTEST", proc.returncode, proc.stdout, proc.stderr[-2000:])
"""


def test_out_of_memory_in_a_5_gib_notebook_is_explained_and_the_selftest_sees_a_cooperative_cap(
    local_cluster, hub, notebook_nodes, tmp_path
):
    user, neighbour = "oona", "nadia"
    started: list[str] = []
    try:
        token, _ = start_server(hub, user, "t4-5g")
        started.append(user)
        start_server(hub, neighbour, "t4-5g")
        started.append(neighbour)
        upload(hub, user, token, write_site(tmp_path / "site"))

        async def scenario() -> tuple[list[tuple[str, dict[str, Any] | None]], dict[str, Any]]:
            async with Kernel(hub, user, token) as kernel:
                held = await kernel.run(HOLD)
                assert held[1] is None and f"held {HOLD_GIB * 1024} MiB" in held[0], held
                me = wait_for_usage(hub, token, HOLD_GIB * 1024)
                return [
                    held,
                    await kernel.run(PAST_THE_SLICE),
                    await kernel.run(CATCH),
                    await kernel.run(SELFTEST),
                ], me

        (held, oom, caught, selftest), me = asyncio.run(scenario())

        # The error the user reads: PyTorch's type and message, the traceback to their line, then the note.
        out, error = oom
        assert error is not None, out
        assert error["ename"] == "OutOfMemoryError", error
        assert error["evalue"].startswith(f"CUDA out of memory. Tried to allocate {HOLD_GIB}.00 GiB."), error
        shown = ANSI.sub("", "\n".join(error["traceback"]))
        assert PAST_THE_SLICE in shown, shown
        assert shown.count(NOTE) == 1, shown
        note = shown[shown.index(NOTE) :].strip()
        assert note.index("Way out:") > 0 and "could not be asked" not in note, (
            f"the note could not ask the hub service; the kernel saw {held[0]!r}:\n{note}"
        )
        check_note(note, me, neighbour)

        # except still catches it, as the same type.
        assert caught == ("caught OutOfMemoryError True\n", None), caught

        # The self-test: the fake's cap held at the slice, and with it lifted it went past: cooperative.
        out, error = selftest
        assert error is None and out.startswith("SELFTEST "), (out, error)
        status, rest = out[len("SELFTEST ") :].split(" ", 1)
        doc = json.loads(rest[: rest.rindex("}") + 1])
        assert (status, doc["slice_mib"], doc["observed_tier"], doc["ok"]) == (
            "0",
            SLICE_GIB * 1024,
            "cooperative",
            True,
        ), doc
        assert doc["claimed_tier"] in ("cooperative", None), doc
        (torch,) = doc["frameworks"]
        assert (
            torch["name"],
            torch["held"],
            torch["stopped_at_mib"],
            torch["cap"],
            torch["hard_cap_held"],
        ) == (
            "torch",
            True,
            # The last step inside PyTorch's cap: the slice's part of what CUDA gives of a T4,
            # less a CUDA context (4476 MiB, core/cardmemory.py), in the self-test's steps.
            cardmemory.framework_mib(SLICE_GIB * 1024, "Tesla-T4", 15360)
            // DEFAULT_STEP_MIB
            * DEFAULT_STEP_MIB,
            "framework",
            False,
        ), doc
        assert doc["card"] and doc["card"].startswith("GPU-"), doc
    finally:
        for name in started:
            stop_server(hub, local_cluster, name)
