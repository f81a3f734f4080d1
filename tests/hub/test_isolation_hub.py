"""Issue 13, hub tier: inside a notebook spawned through the real hub, a kernel and a Jupyter
terminal both get PyTorch capped to the 5 GiB slice by the start-up hook that the plugin's
Allocate delivers (its mount, rewritten to a host folder by the node agent, and PYTHONPATH).
Issue 37: two kernels of one notebook server share the one slice through the container ledger
(in the container's own /tmp, a folder of its own per local pod), and a killed kernel's share
comes back.

The torch is the unit tests' fake (a torch 2.10 by its metadata, so the hook both adds the
allocator setting before torch runs and queues ``set_per_process_memory_fraction`` for CUDA's
start); it is uploaded into the notebook's working directory through the Contents API, as a
person would upload files, and it logs what the hook made it do.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpushare_hub.core import cardmemory
from gpushare_hub.localcluster.hub import LocalHub
from gpushare_hub.localcluster.notebooknodes import venv_bin
from tests.support.hub_helpers import Kernel, run_in_kernel, start_server, stop_server
from tests.support.isolation import fake_site, upload

SLICE_MIB = 5 * 1024

# Run in a kernel and in the terminal's ``python -c``: import torch (the fake, from the working
# directory), allocate, and print what the fake recorded. 'CAP' + 'S' keeps the terminal's echo
# of the command from matching the result's marker.
READ_CAP = (
    "import json, os; os.environ['FAKE_LOG'] = os.path.abspath('{log}'); "
    "import torch; torch.cuda.empty(1024); "
    "print('CAP' + 'S', json.dumps([json.loads(line) for line in open('{log}')]))"
)
RESULT = re.compile(r"CAPS (\[.*?\])\r?\n")


async def _terminal(hub: LocalHub, user: str, token: str, command: str, timeout: float) -> str:
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    status, term = hub.request("POST", f"{hub.url}/user/{user}/api/terminals", token, {})
    assert status == 200, (status, term)
    ws_url = hub.url.replace("http://", "ws://") + f"/user/{user}/terminals/websocket/{term['name']}"
    conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}"}))
    out = ""
    try:
        conn.write_message(json.dumps(["stdin", command + "\r"]))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not RESULT.search(out):
            left = deadline - loop.time()
            try:
                raw = await asyncio.wait_for(conn.read_message(), timeout=max(left, 0.001))
            except TimeoutError:
                raise AssertionError(f"no result in {timeout} s; the terminal showed:\n{out}") from None
            assert raw is not None, f"the terminal's websocket closed; it showed:\n{out}"
            kind, *rest = json.loads(raw)
            if kind == "stdout":
                out += rest[0]
    finally:
        conn.close()
        hub.request("DELETE", f"{hub.url}/user/{user}/api/terminals/{term['name']}", token)
    return out


def run_in_terminal(hub: LocalHub, user: str, token: str, command: str, timeout: float = 120) -> str:
    """Type ``command`` into a new Jupyter terminal of the user's server; what it showed up to the result."""
    return asyncio.run(_terminal(hub, user, token, command, timeout))


def recorded(text: str) -> list[list[Any]]:
    m = RESULT.search(text)
    assert m, text
    return json.loads(m.group(1))  # type: ignore[no-any-return]


def assert_capped(events: list[list[Any]], card_mib: int, where: str) -> None:
    # What PyTorch may hold of a 5 GiB slice of a T4 (core/cardmemory.py): the slice's part of
    # the 15110 MiB CUDA gives (Allocate's GPUSHARE_CARD_CUDA_MIB), less the process's context.
    cap_mib = cardmemory.framework_mib(SLICE_MIB, "Tesla-T4", card_mib)
    cuda_mib = cardmemory.cuda_mib("Tesla-T4", card_mib)
    # Before torch ran, the allocator setting had that share of CUDA's memory ...
    assert events[0] == ["import", f"per_process_memory_fraction:{cap_mib / cuda_mib:.6f}"], (where, events)
    # ... and when CUDA started, the exact fraction of the total CUDA reports (here the fake's,
    # the card's) was set before the first allocation.
    exact = ["set_fraction", round(cap_mib / card_mib, 4), 0]
    assert exact in events, (where, events)
    assert events.index(exact) < events.index(["alloc", 1024]), (where, events)


@contextmanager
def server_with_fake_torch(local_cluster: Any, hub: LocalHub, user: str, tmp_path: Any) -> Iterator[str]:
    """``user``'s 5 GiB server with the fake torch uploaded into it; its token. Stopped after."""
    token, _ = start_server(hub, user, "slice-5")
    try:
        upload(hub, user, token, fake_site(tmp_path, "2.10.0"))
        yield token
    finally:
        stop_server(hub, local_cluster, user)


def test_a_kernel_and_a_terminal_of_a_5_gib_notebook_both_get_pytorch_capped_by_the_hook(
    local_cluster, hub, notebook_nodes, tmp_path
):
    user = "isolde"
    with server_with_fake_torch(local_cluster, hub, user, tmp_path) as token:
        kernel = recorded(run_in_kernel(hub, user, token, READ_CAP.format(log="kernel.log")))
        assert_capped(kernel, notebook_nodes.mib, "kernel")

        # The terminal runs a login shell (terminado's default), whose /etc/profile resets PATH:
        # put the local image's programs first again, as a real image's PATH would have them.
        # PYTHONPATH is left as the container got it.
        code = READ_CAP.format(log=f"terminal-{uuid.uuid4().hex[:8]}.log")
        command = f'export PATH="{venv_bin()}:$PATH"; command -v python; python -c "{code}"'
        shown = run_in_terminal(hub, user, token, command)
        assert f"{venv_bin()}/python\r\n" in shown, shown
        assert_capped(recorded(shown), notebook_nodes.mib, "terminal")


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Takes GiB of the fake torch's card memory, then waits a little over the ledger's interval, so
# that the container's other processes have seen it when the cell ends.
TAKE = (
    "import os, time, torch\n"
    "kept = globals().setdefault('kept', [])\n"
    "kept.append(torch.empty(int({gib} * 1024**3), dtype=torch.uint8, device='cuda'))\n"
    "time.sleep(1.2)\n"
    "print('took', {gib}, 'pid', os.getpid())\n"
)


def test_two_kernels_of_a_5_gib_notebook_share_its_slice_and_a_killed_ones_share_comes_back(
    local_cluster, hub, notebook_nodes, tmp_path
):
    user = "kerstin"
    with server_with_fake_torch(local_cluster, hub, user, tmp_path) as token:

        async def scenario() -> None:
            async with (
                Kernel(hub, user, token, notebook="notebook-a.ipynb") as a,
                Kernel(hub, user, token, notebook="notebook-b.ipynb") as b,
            ):
                out, error = await a.run(TAKE.format(gib=3))
                assert error is None and out.startswith("took 3 pid "), (out, error)
                first_pid = int(out.split()[-1])

                # The second kernel's cap is what the first left, each kernel's CUDA context
                # counted (560 MiB each, core/cardmemory.py): of the slice's 5036 MiB of a T4 the
                # first holds 3 GiB + 560 MiB, the second may take 844 MiB. 3 GiB more is
                # refused, and the note says who holds the rest of the slice.
                out, error = await b.run(TAKE.format(gib=3))
                assert error is not None and error["ename"] == "OutOfMemoryError", (out, error)
                shown = ANSI.sub("", "\n".join(error["traceback"]))
                held = "hold 3.55 GiB of the slice (each with its CUDA context): notebook-a.ipynb"
                assert held in shown, shown
                out, error = await b.run(TAKE.format(gib=0.5))
                assert error is None and out.startswith("took 0.5"), (out, error)
                # The slice is full: a little more in the first kernel is refused too.
                out, error = await a.run(TAKE.format(gib=1))
                assert error is not None and error["ename"] == "OutOfMemoryError", (out, error)
                shown = ANSI.sub("", "\n".join(error["traceback"]))
                assert "hold 1.05 GiB of the slice (each with its CUDA context): notebook-b.ipynb" in shown, (
                    shown
                )

                # The first kernel dies without a word (as the out-of-memory killer would end it):
                # its 3 GiB come back to the second.
                os.kill(first_pid, signal.SIGKILL)
                out, error = await b.run("time.sleep(1.2)\n" + TAKE.format(gib=3))
                assert error is None and out.startswith("took 3"), (out, error)

        asyncio.run(scenario())
