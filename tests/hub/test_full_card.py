"""Issue 47, part 1: a full T4 still gives every slice its size.

A node of the test's own (``t4-1``: one Tesla T4, 15360 MiB to NVML) and a hub of its own. ann,
ben and cat each hold a 5 GiB slice on that one card: it is sold out. The fake GPU framework
models the card as CUDA sees it, with the figures measured: 15110 MiB that CUDA can give, and a
CUDA context of 522 MiB per process outside PyTorch's allocator (PyTorch on an H200: a 3 GiB
tensor showed as 3.51 GiB). One after the other, all three holding, each notebook allocates
until something stops it. Each must be stopped by its own slice's cap, never by the card (a raw
CUDA out-of-memory error, what the third notebook met before: the first two had taken 5120 MiB
each, contexts on top), and each gets what the spawn form promised it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare_hub.core import cardmemory
from gpushare_hub.localcluster.hub import LocalHub
from gpushare_hub.localcluster.notebooknodes import NotebookNodes
from tests.support.hub_helpers import Kernel, pod_of, spawn_form
from tests.support.isolation import fake_site, upload
from tests.support.own_hub import own_hub, own_nodes

USERS = ("t4-ann", "t4-ben", "t4-cat")
CUDA_MIB, CONTEXT_MIB, STEP_MIB = 15110, 522, 16
# Allocate in steps until stopped; say what stopped it: the per-process fraction (the slice's
# cap) when one more step would pass it, else the card.
FILL = f"""
import json, os
os.environ["FAKE_TOTAL_MIB"], os.environ["FAKE_CONTEXT_MIB"] = "{CUDA_MIB}", "{CONTEXT_MIB}"
import torch
held = []
while True:
    try:
        held.append(torch.empty({STEP_MIB} * 2**20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError as err:
        stopped = str(err)
        break
cap = torch.cuda._fraction * torch.cuda.get_device_properties(0).total_memory
reserved = torch.cuda.memory_reserved()
print("FILLED", json.dumps({{"reserved_mib": reserved / 2**20, "cap_mib": cap / 2**20,
                             "by_cap": reserved + {STEP_MIB} * 2**20 > cap, "stopped": stopped[:120]}}))
"""


@pytest.fixture
def t4_nodes(local_cluster: Any, gpushare: Any) -> NotebookNodes:
    return own_nodes(local_cluster, "full-t4", "t4-")


@pytest.fixture
def t4_hub(local_cluster: Any, hub: Any, t4_nodes: NotebookNodes) -> Iterator[LocalHub]:
    del hub  # the session's hub made the namespace
    with own_hub(local_cluster, "full-t4", "hub-t4", USERS) as h:
        yield h


def test_three_5_gib_notebooks_on_a_full_t4_each_get_what_the_form_says(local_cluster, t4_nodes, t4_hub):
    hub = t4_hub
    tokens = {u: hub.user_token(u) for u in USERS}
    # The form's promise for this slice, on this card.
    promised = cardmemory.framework_mib(5 * 1024, "Tesla-T4", 15360)
    assert promised == 4476
    form = spawn_form(hub, USERS[0])
    assert "PyTorch gets about 4.3 GiB of it" in form, form[:3000]
    for u in USERS:
        status, body = hub.api("POST", f"/users/{u}/server", {"profile": "t4-5g"})
        assert status in (201, 202), (status, body)
    for u in USERS:
        hub.wait_ready(u)
        assert pod_of(local_cluster, u)["spec"]["nodeName"] == "t4-1"
        upload(hub, u, tokens[u], fake_site(local_cluster.workdir / f"site-{u}", "2.10.0"))

    async def fill_all() -> list[dict[str, Any]]:
        found = []
        async with (
            Kernel(hub, USERS[0], tokens[USERS[0]], notebook="a.ipynb") as a,
            Kernel(hub, USERS[1], tokens[USERS[1]], notebook="b.ipynb") as b,
            Kernel(hub, USERS[2], tokens[USERS[2]], notebook="c.ipynb") as c,
        ):
            for k in (a, b, c):  # one after the other, each holding what it took
                out, error = await k.run(FILL, timeout=300)
                assert error is None, (out, error)
                line = next(x for x in out.splitlines() if x.startswith("FILLED "))
                found.append(json.loads(line[len("FILLED ") :]))
        return found

    results = asyncio.run(fill_all())
    for user, got in zip(USERS, results, strict=True):
        # Stopped by its own slice's cap, not by a full card ...
        assert got["by_cap"], (user, got)
        # ... after taking what the form promised (to a step).
        assert got["reserved_mib"] >= promised - STEP_MIB, (user, got)
    # What the card held at the end fits what CUDA gives: 3 x (4476 + 522) MiB of 15110.
    assert sum(r["reserved_mib"] + CONTEXT_MIB for r in results) <= CUDA_MIB
