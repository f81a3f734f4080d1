"""Issue 46, done when: a card holds more notebooks than its memory.

A node of the test's own (``oc-1``: one 15 GiB card, its device plugin with ``--overcommit=2``)
and a hub of the test's own whose service hibernates the kernels of group ``sleepy`` (alice)
after 20 s of running nothing. alice, bob and carol hold 5 GiB slices on the card, awake: the
card is full. dave's 5 GiB spawn waits; once alice's kernel has hibernated (the plugin measures
her pod's memory gone) it lands on the card. Then alice runs a cell: her wake waits until the
plugin has had the idle bob hibernated (carol is busy: never hibernated for someone else), and
then her kernel prints what it computed before. All along, what the card holds awake, as the
plugin measures it (the fake GPU framework's claims), never passes the card.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare_hub.localcluster.hub import LocalHub
from gpushare_hub.localcluster.notebooknodes import NotebookNodes
from tests.conftest import wait_for
from tests.support.hub_helpers import Kernel, pod_of
from tests.support.isolation import fake_site, upload
from tests.support.own_hub import own_hub, own_nodes

CARD_MIB = 15360
USERS = ALICE, BOB, CAROL, DAVE = "oc-alice", "oc-bob", "oc-carol", "oc-dave"
TAKE = (
    "import torch\n"
    "x = torch.full(4 * 1024**3, 7, dtype=torch.uint8, device='cuda')\n"
    "before = 'computed before hibernation'\n"
    "print('took')"
)
SUM = 7 * 4 * 1024**3
PLUGIN_ARGS = (
    "--overcommit=2",
    "--hibernation-host-memory-gib=20",
    "--hibernation-min-idle=5",
    "--usage-interval=1",
)


@pytest.fixture
def oc_nodes(local_cluster: Any, gpushare: Any) -> NotebookNodes:
    return own_nodes(local_cluster, "overcommit", "oc-", PLUGIN_ARGS)


@pytest.fixture
def oc_hub(local_cluster: Any, hub: Any, oc_nodes: NotebookNodes) -> Iterator[LocalHub]:
    del hub  # the session's hub made the namespace
    settings = {
        "gpu_idle_action": "notify",
        "gpu_idle_action_per_group": {"sleepy": "hibernate"},
        "gpu_idle_return_after": 20,
        "gpu_idle_check_seconds": 2,
        "state_db": str(local_cluster.workdir / "hub-oc" / "gpushare-service.sqlite"),
    }
    config = "\n".join(
        [
            "from gpushare_hub.service import configure_hub",
            f"c.JupyterHub.load_groups = {{'sleepy': {{'users': [{ALICE!r}]}}}}",
            *(f"c.GPUShareService.{k} = {v!r}" for k, v in settings.items()),
            "configure_hub(c, name='gpushare')",
        ]
    )
    with own_hub(local_cluster, "overcommit", "hub-oc", USERS, extra_config=config) as h:
        yield h


def awake_mib(claims: Any) -> int:
    """What the card holds, as the plugin measures it: the live claims' MiB."""
    total = 0
    for path in claims.glob("*.json"):
        try:
            total += int(json.loads(path.read_text())["mib"])
        except (OSError, ValueError, KeyError):
            continue
    return total


def kernels(hub: LocalHub, user: str, token: str) -> dict[str, Any]:
    status, doc = hub.request("GET", f"{hub.url}/user/{user}/gpushare/api/hibernation", token)
    assert status == 200, (status, doc)
    return {k["id"]: k for k in doc["kernels"]}


def sleep_rule(hub: LocalHub, user: str, token: str, kernel: Kernel, action: str) -> tuple[int, Any]:
    """The status bar's Keep awake (``keep-awake``) or its undoing (``allow-sleep``)."""
    url = f"{hub.url}/user/{user}/gpushare/api/hibernation/{kernel.kernel_id}"
    return hub.request("POST", url, token, {"action": action})


def unschedulable(pod: dict[str, Any] | None) -> bool:
    """kube-scheduler has tried the pod and found no node for it (PodScheduled False)."""
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions)


def test_a_card_holds_four_5_gib_notebooks_by_hibernating_idle_kernels(local_cluster, oc_nodes, oc_hub):
    hub, claims = oc_hub, oc_nodes.claims_dir("oc-1")
    tokens = {u: hub.user_token(u) for u in USERS}
    peaks: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.2):
            peaks.append(awake_mib(claims))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for u in (ALICE, BOB, CAROL):
            status, body = hub.api("POST", f"/users/{u}/server", {"profile": "t4-5g"})
            assert status in (201, 202), (status, body)
        for u in (ALICE, BOB, CAROL):
            hub.wait_ready(u)
            upload(hub, u, tokens[u], fake_site(local_cluster.workdir / f"site-{u}", "2.10.0"))

        async def scenario() -> None:
            async with (
                Kernel(hub, ALICE, tokens[ALICE], notebook="a.ipynb") as a,
                Kernel(hub, BOB, tokens[BOB], notebook="b.ipynb") as b,
                Kernel(hub, CAROL, tokens[CAROL], notebook="c.ipynb") as c,
            ):
                # alice's kernel is held awake until dave's spawn is seen waiting: the wait must
                # be the full card's, however slowly the steps before it go on a loaded machine.
                status, body = await asyncio.to_thread(sleep_rule, hub, ALICE, tokens[ALICE], a, "keep-awake")
                assert status == 200, (status, body)
                for k in (a, b, c):
                    out, error = await k.run(TAKE)
                    assert error is None and out.strip() == "took", (out, error)

                # The card is full: dave's spawn waits.
                status, body = await asyncio.to_thread(
                    hub.api, "POST", f"/users/{DAVE}/server", {"profile": "t4-5g"}
                )
                assert status in (201, 202), (status, body)
                waits = await asyncio.to_thread(
                    wait_for, lambda: unschedulable(pod_of(local_cluster, DAVE)), 120
                )
                assert waits, pod_of(local_cluster, DAVE)
                assert not (pod_of(local_cluster, DAVE) or {}).get("spec", {}).get("nodeName")
                assert kernels(hub, ALICE, tokens[ALICE])[a.kernel_id]["state"] == "awake"

                # alice's kernel, let sleep again, has run nothing for 20 s: it hibernates, and
                # dave lands.
                status, body = await asyncio.to_thread(
                    sleep_rule, hub, ALICE, tokens[ALICE], a, "allow-sleep"
                )
                assert status == 200, (status, body)
                hibernated = await asyncio.to_thread(
                    wait_for,
                    lambda: kernels(hub, ALICE, tokens[ALICE])[a.kernel_id]["state"] == "hibernated",
                    120,
                )
                assert hibernated, kernels(hub, ALICE, tokens[ALICE])
                await asyncio.to_thread(hub.wait_ready, DAVE)
                assert pod_of(local_cluster, DAVE)["spec"]["nodeName"] == "oc-1"
                await asyncio.to_thread(
                    upload, hub, DAVE, tokens[DAVE], fake_site(local_cluster.workdir / "site-dave", "2.10.0")
                )
                async with Kernel(hub, DAVE, tokens[DAVE], notebook="d.ipynb") as d:
                    out, error = await d.run(TAKE)
                    assert error is None and out.strip() == "took", (out, error)

                    # carol is busy; alice runs a cell: bob (idle) hibernates for her, then
                    # she wakes.
                    busy = asyncio.ensure_future(
                        c.run("import time; time.sleep(60); print('done')", timeout=300)
                    )
                    await asyncio.sleep(2)
                    out, error = await a.run("print(x.sum(), before)", timeout=300)
                    # The cell's output said why it waited, then the kernel ran it.
                    lines = out.strip().splitlines()
                    assert error is None and lines[-1] == f"{SUM} computed before hibernation", (out, error)
                    assert any(w.startswith("gpushare: waiting for 5 GiB on your card") for w in lines), out
                    assert kernels(hub, BOB, tokens[BOB])[b.kernel_id]["state"] == "hibernated"
                    assert kernels(hub, CAROL, tokens[CAROL])[c.kernel_id]["state"] == "awake"
                    out, error = await busy
                    assert error is None and out.strip() == "done", (out, error)

        asyncio.run(scenario())
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert peaks and max(peaks) <= CARD_MIB, max(peaks or [0])
