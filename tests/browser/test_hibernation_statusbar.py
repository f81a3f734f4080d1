"""JupyterLab's status bar and panel show kernel hibernation (issue 46): a user's 5 GiB server,
spawned through the session's hub, runs two notebooks' kernels with the fake torch uploaded.
``big.ipynb`` holds 3 GiB; "Hibernate now" in the panel moves it off the card (the item says
``1 kernel hibernated``, the kernel ``hibernated since HH:MM``); ``small.ipynb`` then takes 4 GiB
(the hibernated kernel counts 0), so the next cell sent to ``big.ipynb`` waits for room inside the
slice (``wake waiting``, the kernel next in line and why) until ``small.ipynb`` frees its memory;
then it wakes and prints what it computed before.

Screenshots (out/browser, see conftest.OUT): statusbar-awake.png, statusbar-hibernated.png,
statusbar-waiting.png, statusbar-waking.png (the simulated card copies at 4 s a GiB for that
picture: ``rates.json`` in the node's claims folder) and statusbar-woken.png.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any

from tests.support.hub_helpers import Kernel, pod_of, start_server, stop_server
from tests.support.isolation import fake_site, upload

from .conftest import OUT, login

USER = "hiro"
STATUS = "(document.querySelector('#gpushare-statusbar') || {}).textContent || ''"
TAKE_3 = (
    "import torch\n"
    "x = torch.full(3 * 1024**3, 7, dtype=torch.uint8, device='cuda')\n"
    "before = 'computed before hibernation'"
)
TAKE_4 = "import torch\ny = torch.full(4 * 1024**3, 1, dtype=torch.uint8, device='cuda')"
FREE_4 = "del y\ntorch.cuda.empty_cache()"
SUM = 7 * 3 * 1024**3
NO_TOASTS = ".jp-toastContainer, .Toastify { display: none !important; }"


class BackgroundLoop:
    """An asyncio loop in a thread of its own: the kernels' websockets live there, beside
    Playwright's synchronous page."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def start(self, coro: Coroutine[Any, Any, Any]) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 180) -> Any:
        return self.start(coro).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


def run(loop: BackgroundLoop, kernel: Kernel, code: str) -> str:
    out, error = loop.call(kernel.run(code))
    assert error is None, "\n".join(error["traceback"])
    return str(out)


def row_js(kernel_id: str) -> str:
    """JavaScript: the kernel's row in the panel, or null."""
    return f"document.querySelector('tr.gpushare-kernel[data-kernel=\"{kernel_id}\"]')"


def state_of(kernel_id: str) -> str:
    """JavaScript: the state of the kernel's row in the panel ('' while it has none)."""
    return f"((({row_js(kernel_id)} || {{}}).dataset || {{}}).state || '')"


def test_the_status_bar_shows_a_kernel_hibernated_waiting_for_room_and_woken(
    local_cluster, hub, notebook_nodes, browser_page, tmp_path
):
    page = browser_page
    login(page, hub.url, USER)  # before the server starts: after it, the login goes on to the server
    loop = BackgroundLoop()
    kernels: list[Kernel] = []
    started = False
    try:
        token, _ = start_server(hub, USER, "t4-5g")
        started = True
        upload(hub, USER, token, fake_site(tmp_path, "2.10.0"))
        big, small = (
            Kernel(hub, USER, token, notebook="big.ipynb"),
            Kernel(hub, USER, token, notebook="small.ipynb"),
        )
        for k in (big, small):
            loop.call(k.__aenter__())
            kernels.append(k)
        run(loop, big, TAKE_3)

        # Awake: the item says what the slice holds, the panel lists both notebooks' kernels.
        page.goto(f"{hub.url}/user/{USER}/lab")
        item = page.locator("#gpushare-statusbar")
        item.wait_for(timeout=180_000)  # JupyterLab's first load on a busy machine
        page.add_style_tag(content=NO_TOASTS)
        page.wait_for_function(f"({STATUS}).startsWith('GPU 3.0 / 5 GiB')", timeout=120_000)
        item.click()
        row = page.locator(f'tr.gpushare-kernel[data-kernel="{big.kernel_id}"]')
        row.wait_for(timeout=30_000)
        # Named by JupyterLab's own list of sessions.
        page.wait_for_function(f"{row_js(big.kernel_id)}.querySelector('th').textContent === 'big.ipynb'")
        assert row.locator(".gpushare-kernel-state").inner_text() == "awake"
        rule = page.locator("#gpushare-kernels .gpushare-hibernation-rule").inner_text()
        # The service's default idle action, auto, hibernates idle kernels on a node whose plugin
        # says its driver can (a simulated node can): after the hub's 2 h.
        assert rule.startswith("Idle kernels hibernate after 2 h idle: their GPU memory moves"), rule
        assert row.locator("button.gpushare-hibernate-now").inner_text() == "Hibernate now"
        assert row.locator("button.gpushare-keep-awake").inner_text() == "Keep awake"
        assert "hibernat" not in item.inner_text() and "wake" not in item.inner_text(), item.inner_text()
        page.screenshot(path=str(OUT / "statusbar-awake.png"))

        # Hibernated: pressed in the panel; the card's use falls to 0 when the plugin measures it.
        row.locator("button.gpushare-hibernate-now").click()
        said = page.locator("#gpushare-kernels-said")
        refused = "!!document.querySelector('#gpushare-kernels-said')"
        page.wait_for_function(f"{state_of(big.kernel_id)} === 'hibernated' || {refused}", timeout=60_000)
        assert row.get_attribute("data-state") == "hibernated", said.all_inner_texts()
        page.wait_for_function(
            f"/^GPU (0\\.0|\\?) \\/ 5 GiB/.test({STATUS}) && ({STATUS}).endsWith(' · 1 kernel hibernated')",
            timeout=120_000,
        )
        headline = row.locator(".gpushare-kernel-state").inner_text()
        assert re.fullmatch(r"hibernated since \d\d:\d\d", headline), headline
        words = row.locator(".gpushare-kernel-words").inner_text()
        assert re.fullmatch(
            # Its 3 GiB and its CUDA context (560 MiB, counted as the hook counts it: core/cardmemory.py).
            r"hibernated \d+ (s|min) ago: its 3\.5 GiB of GPU memory is in host memory; "
            r"the next cell wakes it with every variable",
            words,
        ), words
        assert row.locator("button.gpushare-wake").inner_text() == "Wake"
        assert row.locator("button.gpushare-hibernate-now").count() == 0
        page.screenshot(path=str(OUT / "statusbar-hibernated.png"))

        # Waiting: the other notebook takes 4 GiB (the hibernated kernel counts 0), so the next
        # cell of big.ipynb waits for 3 GiB inside the 5 GiB slice, first in line. The cell goes
        # once the status bar shows the 4 GiB, as a person would send it: the container ledger
        # that the wake reads publishes each process's use every 0.5 s.
        run(loop, small, TAKE_4)
        page.wait_for_function(f"({STATUS}).startsWith('GPU 4.0 / 5 GiB')", timeout=120_000)
        cell = loop.start(big.run("print(x.sum(), before)", timeout=300))
        page.wait_for_function(f"{state_of(big.kernel_id)} === 'waiting'", timeout=60_000)
        page.wait_for_function(f"({STATUS}).endsWith(' · wake waiting')", timeout=30_000)
        assert item.inner_text().startswith("GPU 4.0 / 5 GiB"), item.inner_text()
        assert row.locator(".gpushare-kernel-state").inner_text() == "waiting to wake, next in line"
        words = row.locator(".gpushare-kernel-words").inner_text()
        assert words.startswith(
            "waiting for 3.5 GiB inside your 5.0 GiB slice: your other GPU processes hold 4.5 GiB"
        ), words
        assert words.endswith("free that memory, or hibernate or stop them"), words
        assert not cell.done(), "the cell ran before its kernel could wake"
        page.screenshot(path=str(OUT / "statusbar-waiting.png"))

        # Waking: the other notebook frees its memory; the card copies the 3 GiB back at 4 s a
        # GiB (the simulated card's rate, set for this picture; an H200 took 0.2 s a GiB).
        claims = notebook_nodes.claims_dir(pod_of(local_cluster, USER)["spec"]["nodeName"])
        (claims / "rates.json").write_text('{"restore_s_per_gib": 4}')
        run(loop, small, FREE_4)
        page.wait_for_function(f"{state_of(big.kernel_id)} === 'waking'", timeout=30_000)
        page.wait_for_function(f"({STATUS}).endsWith(' · waking…')", timeout=10_000)
        assert row.locator(".gpushare-kernel-state").inner_text().startswith("waking"), row.inner_text()
        page.screenshot(path=str(OUT / "statusbar-waking.png"))
        (claims / "rates.json").unlink()

        # Woken: the cell runs with what the kernel had.
        out, error = cell.result(timeout=180)
        assert error is None, error
        assert out.startswith("gpushare: waiting for 3.5 GiB inside your 5.0 GiB slice"), out
        assert out.splitlines()[-1] == f"{SUM} computed before hibernation", out
        page.wait_for_function(f"{state_of(big.kernel_id)} === 'awake'", timeout=30_000)
        page.wait_for_function(
            f"({STATUS}).startsWith('GPU 3.0 / 5 GiB') && !({STATUS}).includes('wak')", timeout=120_000
        )
        assert "hibernat" not in item.inner_text(), item.inner_text()
        assert row.locator(".gpushare-kernel-state").inner_text() == "awake"
        page.screenshot(path=str(OUT / "statusbar-woken.png"))

        # Keep awake, and back.
        row.locator("button.gpushare-keep-awake").click()
        row.locator("button.gpushare-allow-sleep").wait_for(timeout=30_000)
        assert row.locator(".gpushare-kernel-state").inner_text() == "awake, kept awake"
        row.locator("button.gpushare-allow-sleep").click()
        row.locator("button.gpushare-keep-awake").wait_for(timeout=30_000)
        assert row.locator(".gpushare-kernel-state").inner_text() == "awake"
    except Exception:
        page.screenshot(path=str(OUT / "statusbar-hibernation-failure.png"))
        raise
    finally:
        for k in kernels:  # the server's stop below ends a kernel left over anyway
            with contextlib.suppress(Exception):
                loop.call(k.__aexit__(None, None, None), timeout=60)
        loop.close()
        if started:
            stop_server(hub, local_cluster, USER)
