"""A notebook user is warned in JupyterLab that their idle GPU slice is about to be returned, and
keeps it: the status bar says "GPU idle: returned in ...", the panel shows the hub service's words
and a Keep button; pressing it puts the return off (once) and the warning goes. Screenshots:
out/browser/statusbar-idle-warning.png and statusbar-idle-kept.png."""

from __future__ import annotations

from tests.conftest import wait_for
from tests.support.hub_helpers import pod_of
from tests.support.idle_hub import idle_hub

from .conftest import OUT, login

USER = "kim"
STATUS = "(document.querySelector('#gpushare-statusbar') || {}).textContent || ''"


def test_the_status_bar_warns_of_an_idle_slice_and_keep_puts_the_return_off(
    local_cluster, hub, notebook_nodes, browser_page
):
    del hub  # the session's hub made the namespace
    page = browser_page
    idle = idle_hub(local_cluster, return_after=900, warn_before=890)  # warned from 10 s idle
    try:
        login(page, idle.url, USER)
        idle.user_token(USER)
        status, body = idle.api("POST", f"/users/{USER}/server", {"profile": "t4-5g"})
        assert status in (201, 202), (status, body)
        idle.wait_ready(USER, timeout=400)

        page.goto(f"{idle.url}/user/{USER}/lab")
        item = page.locator("#gpushare-statusbar")
        item.wait_for(timeout=180_000)
        # The plugin reads usage every 15 s; the status bar every 10 s.
        page.wait_for_function(f"({STATUS}).startsWith('GPU idle: returned in')", timeout=120_000)
        assert "/ 5 GiB" in item.inner_text()
        item.click()
        keep = page.locator("#gpushare-keep")
        keep.wait_for(timeout=30_000)
        problem = page.locator(".gpushare-panel-body .gpushare-problem").inner_text()
        assert "your GPU has been idle for" in problem and "unless you use it or press Keep" in problem, (
            problem
        )
        page.screenshot(path=str(OUT / "statusbar-idle-warning.png"), full_page=True)

        keep.click()
        result = page.locator("#gpushare-keep-result")
        result.wait_for(timeout=30_000)
        assert result.inner_text().startswith("Kept: your GPU slice stays for at least"), result.inner_text()
        page.wait_for_function(f"!({STATUS}).startsWith('GPU idle')", timeout=30_000)
        assert page.locator("#gpushare-keep").count() == 0  # once per idle stretch
        page.screenshot(path=str(OUT / "statusbar-idle-kept.png"), full_page=True)
    finally:
        if idle.api("GET", f"/users/{USER}")[1].get("servers"):
            idle.api("DELETE", f"/users/{USER}/server")
        wait_for(lambda: pod_of(local_cluster, USER) is None, timeout=120)
        idle.stop()
