"""Issue 46, hub tier: a kernel of a notebook spawned through the real hub hibernates, and the
next cell wakes it with its variables.

The notebook server runs gpushare's server extension; on these simulated nodes its hibernator
checkpoints through the simulated driver (the fake torch's claims are what the device plugin
measures on the card). The kernel takes 3 GiB through the fake torch; the status bar's button
(``POST gpushare/api/hibernation/<kernel>``) hibernates it: its claim leaves the card and the
container ledger counts it at 0. A cell sent through the kernel's websocket then wakes it before
it runs, and prints what the kernel computed before.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.support.hub_helpers import Kernel, pod_of, start_server, stop_server
from tests.support.isolation import fake_site, upload

USER = "hana"
TAKE = (
    "import os, torch\n"
    "x = torch.full(3 * 1024**3, 7, dtype=torch.uint8, device='cuda')\n"
    "before = 'computed before hibernation'\n"
    "print('took', os.getpid())"
)
SUM = 7 * 3 * 1024**3


def hibernation(
    hub: Any, token: str, kernel_id: str = "", body: dict[str, str] | None = None
) -> tuple[int, Any]:
    url = f"{hub.url}/user/{USER}/gpushare/api/hibernation" + (f"/{kernel_id}" if kernel_id else "")
    return hub.request("POST" if body is not None else "GET", url, token, body)  # type: ignore[no-any-return]


def kernel_state(hub: Any, token: str, kernel_id: str) -> dict[str, Any]:
    status, doc = hibernation(hub, token)
    assert status == 200, (status, doc)
    return next((k for k in doc["kernels"] if k["id"] == kernel_id), {})


def test_a_hibernated_kernel_frees_the_card_and_the_next_cell_wakes_it_with_its_variables(
    local_cluster, hub, notebook_nodes, tmp_path
):
    token, _ = start_server(hub, USER, "slice-5")
    try:
        upload(hub, USER, token, fake_site(tmp_path, "2.10.0"))
        node = pod_of(local_cluster, USER)["spec"]["nodeName"]
        claims = notebook_nodes.claims_dir(node)

        async def scenario() -> None:
            async with Kernel(hub, USER, token, notebook="big.ipynb") as k:
                out, error = await k.run(TAKE)
                assert error is None and out.startswith("took "), (out, error)
                pid = int(out.split()[-1])
                assert json.loads((claims / f"{pid}.json").read_text())["mib"] == 3072
                # Hibernate now (the status bar's button); the kernel's entry in the container
                # ledger comes within its interval.
                status, doc = await asyncio.to_thread(
                    hibernation, hub, token, k.kernel_id, {"action": "hibernate"}
                )
                for _ in range(20):
                    if status != 409:
                        break
                    await asyncio.sleep(0.5)
                    status, doc = await asyncio.to_thread(
                        hibernation, hub, token, k.kernel_id, {"action": "hibernate"}
                    )
                assert status == 200 and doc["state"] == "hibernated", (status, doc)
                # What it held: its 3 GiB and its CUDA context (560 MiB, core/cardmemory.py).
                assert doc["pids"] == [pid] and doc["held_mib"] == 3072 + 560, doc
                assert "the next cell wakes it with every variable" in doc["words"], doc
                # The card holds nothing of it: the device plugin measures the claim gone.
                assert not (claims / f"{pid}.json").exists()
                assert kernel_state(hub, token, k.kernel_id)["state"] == "hibernated"

                # The next cell wakes it first, then runs on the GPU with what it had.
                out, error = await k.run("print(x.sum(), before)")
                assert error is None and out.strip() == f"{SUM} computed before hibernation", (out, error)
                assert json.loads((claims / f"{pid}.json").read_text())["mib"] == 3072
                assert kernel_state(hub, token, k.kernel_id)["state"] == "awake"

        asyncio.run(scenario())

        # A bad request is refused with words, not a 500.
        status, doc = hibernation(hub, token, "no-such-kernel", {"action": "hibernate"})
        assert status == 404 and "no kernel" in json.dumps(doc), (status, doc)
    finally:
        stop_server(hub, local_cluster, USER)
