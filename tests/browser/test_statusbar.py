"""JupyterLab shows the user's GPU slice in its status bar: two users' 5 GiB notebook servers,
spawned through the session's hub (GPUShareSpawner, with the gpushare hub service), share a card;
one of them holds 3 GiB through the demo's fake torch and opens JupyterLab. The item reads the
server's ``gpushare/api/status`` (which asks the hub service's ``api/v1/me`` with the server's own
token) and says what the slice uses of its 5 GiB, the cap and the neighbour; clicking it opens the
panel with the card, the caps and the neighbours. Screenshots: out/browser/statusbar*.png (see
conftest.OUT); with GPUSHARE_DOCS_IMAGES=docs/images also docs/images/statusbar.png."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor

from gpushare_hub.demo.fakegpu import write_site
from tests.conftest import wait_for
from tests.support.hub_helpers import pod_of, run_in_kernel, stop_server
from tests.support.isolation import upload
from tests.support.pictures import docs_picture

from .conftest import OUT, login

USER, NEIGHBOUR = "stella", "teo"
STATUS = "(document.querySelector('#gpushare-statusbar') || {}).textContent || ''"
# 3 GiB held in a process of the user's server (the simulated plugin reports it as the pod's use);
# the pod is a local process here, and the holder is stopped by its pid at the end.
HOLD = (
    "import subprocess, sys; p = subprocess.Popen([sys.executable, '-m', 'gpushare_hub.demo.fakealloc', "
    "'3', '--seconds', '600'], start_new_session=True); print(p.pid)"
)


def test_the_status_bar_shows_the_slice_its_use_and_the_panel_its_details(
    local_cluster, hub, notebook_nodes, browser_page, tmp_path
):
    page = browser_page
    login(page, hub.url, USER)  # before the server starts: after it, the login goes on to the server
    started: list[str] = []
    holder = 0
    try:
        for user in (NEIGHBOUR, USER):  # binpacked: one card
            hub.user_token(user)
            status, body = hub.api("POST", f"/users/{user}/server", {"profile": "t4-5g"})
            assert status in (201, 202), (status, body)
            started.append(user)
            assert wait_for(
                lambda u=user: (pod_of(local_cluster, u) or {}).get("spec", {}).get("nodeName"), 120
            )
        for user in started:
            hub.wait_ready(user, timeout=400)

        page.goto(f"{hub.url}/user/{USER}/lab")
        item = page.locator("#gpushare-statusbar")
        item.wait_for(timeout=180_000)  # JupyterLab's first load on a busy machine
        # The first reading can come before the service has seen the pod: wait for the hub's view.
        page.wait_for_function(
            f"({STATUS}).includes('/ 5 GiB')",
            timeout=90_000,
        )
        text = item.inner_text()
        page.screenshot(path=str(OUT / "statusbar.png"))
        assert re.fullmatch(r"GPU (\d+\.\d|\?) / 5 GiB( · [^·]+)+", text), text
        assert re.search(r"· (hook cap|no cap: hook not loaded|MPS cap|driver cap) ·", text), text
        assert re.search(r"· (1 other|\d+ others) on this card$", text), text

        with ThreadPoolExecutor(1) as pool:  # asyncio.run beside Playwright's own event loop
            said = pool.submit(run_in_kernel, hub, USER, hub.user_token(USER), HOLD).result(timeout=180)
        assert said.strip().isdigit(), said
        holder = int(said)
        page.wait_for_function(
            f"({STATUS}).startsWith('GPU 3.0 / 5 GiB')",
            timeout=90_000,
        )

        item.click()
        panel = page.locator("#gpushare-panel")
        panel.wait_for()
        card = panel.locator("tr.gpushare-card td").inner_text()
        assert card.startswith("GPU-") and " on node nb-" in card, card
        assert panel.locator("tr.gpushare-slice td").inner_text().startswith("5 GiB of 15 GiB (t4-5g)")
        assert panel.locator("tr.gpushare-used td").inner_text() == "3.0 GiB"
        caps = panel.locator("tr.gpushare-caps td").inner_text()
        # A 5 GiB slice of a T4: 5036 of the 15110 MiB CUDA gives, less a CUDA context (560 MiB).
        assert "PyTorch 29.6% of the card = 4476 MiB of 15110 MiB" in caps, caps
        assert "one slice for all of this server's PyTorch processes together" in caps, caps
        # The simulated node's plugin ran its self-test at start; the panel shows what it observed.
        selftest = panel.locator("tr.gpushare-selftest td").inner_text()
        assert re.match(r"(passed|FAILED): observed \w+", selftest), selftest
        # The local nodes are cooperative: no MPS, so no compute share; the SM use as measured.
        compute = panel.locator("tr.gpushare-compute td").inner_text()
        assert re.fullmatch(r"time-sliced, no compute share(; using \d+% of the SMs now)?", compute), compute
        neighbours = panel.locator("tr.gpushare-neighbours td").inner_text()
        assert re.match(r"(1 server|\d+ servers) holding \d+ GiB", neighbours), neighbours
        # The panel's button runs gpushare-selftest in the server; the fake torch in its working
        # folder stands in for PyTorch (uploaded as a person would upload files).
        upload(hub, USER, hub.user_token(USER), write_site(tmp_path / "site"))
        panel.locator("#gpushare-run-selftest").click()
        result = panel.locator("#gpushare-selftest-result")
        result.wait_for(timeout=180_000)
        lines = result.inner_text().splitlines()
        assert lines[0].startswith("OK: observed cooperative, the node claims cooperative"), lines
        # Held at the last 256 MiB step inside PyTorch's cap (4476 MiB: the slice's part of CUDA's
        # memory less a CUDA context, core/cardmemory.py).
        assert lines[1] == "torch: held at 4352 MiB by the framework cap; its own cap lifted, it got past"
        # JupyterLab's question about its news would cover part of the picture.
        page.add_style_tag(content=".jp-toastContainer, .Toastify { display: none !important; }")
        page.screenshot(path=str(OUT / "statusbar-panel.png"))
        docs_picture(page, "statusbar.png")
    except Exception:
        page.screenshot(path=str(OUT / "statusbar-failure.png"))
        raise
    finally:
        if holder:
            with contextlib.suppress(ProcessLookupError):
                os.kill(holder, signal.SIGTERM)
        for user in started:
            stop_server(hub, local_cluster, user)
