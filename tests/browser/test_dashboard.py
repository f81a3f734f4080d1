"""The "GPU slices" dashboard in a browser: an admin opens it from the hub's Services menu and
sees each card as a bar of users' slices, a card of an overcommitting node with its sums and a
hibernated slice, filters by user, and watches it update after another spawn without reloading;
a node with a broken inventory is shown with its reason; a non-admin gets the 403 page naming
the missing scope; a hub admin sees it without the service's scope, and the API takes their
cookie only with the page's XSRF token. Screenshots: out/browser/ (see conftest.OUT)."""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpushare_hub.core.cards import declared_cards
from gpushare_hub.core.names import CARDS_ANNOTATION, HIBERNATION_ANNOTATION
from gpushare_hub.core.overcommit import HIBERNATED, Book, CardSums, Overcommit, PodRecord, book_annotation
from tests.conftest import wait_for
from tests.support.hub_helpers import (
    GPU_IDLE_AFTER,
    SCRAPER_TOKEN,
    SERVICE,
    SERVICE_ADMIN,
    pod_of,
    stop_server,
)

from .conftest import OUT, login

BROKEN = "svc-broken-inventory"


def spawn(hub: Any, cluster: Any, user: str, profile: str) -> None:
    hub.user_token(user)
    status, body = hub.api("POST", f"/users/{user}/server", {"profile": profile})
    assert status in (201, 202), (status, body)
    assert wait_for(lambda: (pod_of(cluster, user) or {}).get("spec", {}).get("nodeName"), 120)


def segments(page: Any) -> list[dict[str, str]]:
    """The slices drawn on the bars, as data attributes, with the card each sits on."""
    return page.eval_on_selector_all(
        ".seg.alloc",
        """els => els.map(e => ({user: e.dataset.user, server: e.dataset.server, slice: e.dataset.slice,
              since: e.dataset.since, idle: e.dataset.idle, units: e.dataset.units,
              dim: e.classList.contains('dim') ? 'yes' : 'no', text: e.innerText,
              card: e.closest('[data-card]').dataset.card, node: e.closest('[data-node]').dataset.node}))""",
    )


def claim_usage(nodes: Any, cluster: Any, user: str, card: str, mib: int, util: int) -> Any:
    """Claim GPU memory and work for the user's pod where its node's simulated device plugin reads
    usage (what the demo's fake torch writes for a notebook); the claim's process is this one."""
    pod = pod_of(cluster, user)
    assert pod is not None
    claims = nodes.state_dir / "nodes" / pod["spec"]["nodeName"] / "usage-claims"
    claims.mkdir(parents=True, exist_ok=True)
    path = claims / f"{os.getpid()}.json"
    path.write_text(json.dumps({"card": card, "pod": pod["metadata"]["uid"], "mib": mib, "util": util}))
    return path


def show_hibernation(page: Any, cluster: Any, amy: dict[str, str]) -> None:
    pod = pod_of(cluster, "amy")
    assert pod is not None
    since = int(time.time()) - 600
    book = Book({pod["metadata"]["uid"]: PodRecord(HIBERNATED, since, amy["card"], 5120)}, {})
    annotation = book_annotation(
        book, Overcommit(2.0, 65536, 300), {amy["card"]: CardSums(15360, 5120, 5120)}
    )
    api = cluster.core_api()
    api.patch_node(amy["node"], {"metadata": {"annotations": {HIBERNATION_ANNOTATION: annotation}}})
    try:
        seg = page.locator(".seg.alloc[data-user=amy]")
        page.wait_for_selector(".seg.alloc[data-user=amy].hibernated", timeout=30_000)
        assert re.search(r"hibernated since \d\d:\d\d \(1[01] min\)", seg.inner_text()), seg.inner_text()
        assert "awake" in page.locator(".seg.alloc[data-user=bo]").inner_text()
        label = page.locator(f"[data-card='{amy['card']}'] .hibernation").inner_text()
        assert "overcommit ×2 · held 10 / 30 GiB · awake 5 / 15 GiB" in label, label
        assert page.locator("#hibernated-count").inner_text() == "1"
        page.screenshot(path=str(OUT / "dashboard-hibernation.png"), full_page=True)
    finally:
        api.patch_node(amy["node"], {"metadata": {"annotations": {HIBERNATION_ANNOTATION: None}}})
    page.wait_for_function("!document.querySelector('.seg.alloc.hibernated')", timeout=30_000)


def add_broken_node(cluster: Any) -> None:
    body = cluster.node_object(
        BROKEN, declared_cards(BROKEN, 1, "Tesla T4", 15360), labels={"gpushare": "false"}
    )
    body["metadata"]["annotations"][CARDS_ANNOTATION] = "{not json"
    cluster.core_api().create_node(body)


def test_admin_sees_bars_of_users_slices_filters_and_live_updates(
    local_cluster, hub, notebook_nodes, browser_page
):
    page = browser_page
    started: list[str] = []
    add_broken_node(local_cluster)
    try:
        for user in ("amy", "bo"):  # two 5 GiB slices: binpacked onto one card
            spawn(hub, local_cluster, user, "t4-5g")
            started.append(user)
        for user in started:
            hub.wait_ready(user, timeout=400)

        login(page, hub.url, SERVICE_ADMIN)
        page.goto(f"{hub.url}/hub/home")
        page.click("text=Services")
        page.click("a.dropdown-item:has-text('GPU slices')")
        page.wait_for_url(f"**/services/{SERVICE}/**")
        page.wait_for_selector(".seg.alloc[data-user=bo]")
        # Pods come from the watch at once; start and last activity from the hub's REST API, read
        # every hub_poll_seconds (5 s) and at once when a page meets a server the last read did
        # not name: until then the slice shows "idle unknown", and the page's next refresh
        # (every 5 s) shows the idle time.
        page.wait_for_function(
            "['amy', 'bo'].every(u => (document.querySelector(`.seg.alloc[data-user=${u}]`)"
            " || {dataset: {}}).dataset.idle)",
            timeout=30_000,
        )
        page.evaluate("window.__sameDocument = true")
        segs = {s["user"]: s for s in segments(page)}
        assert segs["amy"]["card"] == segs["bo"]["card"], segs
        for user in ("amy", "bo"):
            s = segs[user]
            assert s["slice"] == "t4-5g" and s["units"] == "5" and s["since"], s
            assert s["idle"].isdigit(), s
            assert user in s["text"] and "idle" in s["text"], s
        shared = page.locator(f"[data-card='{segs['amy']['card']}'] .seg.free")
        assert shared.get_attribute("data-free") == "5"
        # The broken node is listed with the reason; the page still works.
        problem = page.locator(f"[data-problem='{BROKEN}']")
        problem.wait_for()
        assert "card inventory unreadable" in problem.inner_text() and "not JSON" in problem.inner_text()
        # Each card's bar is an image to assistive technology, named by its text (an attribute:
        # set as a property, aria-label named nothing).
        bar = page.get_by_role("img", name=re.compile(r"^Tesla-T4 10 of 15 GiB used$"))
        assert bar.count() >= 1, page.locator(".bar").first.evaluate("e => e.outerHTML.slice(0, 200)")
        assert page.locator("#fragmentation").count() == 1
        assert "Tesla-T4" in page.locator(".summary").inner_text()
        # Each node says how it hands cards out: the local notebook nodes' plugins run in legacy
        # mode (their agent reads Allocate's NVIDIA_VISIBLE_DEVICES; no runtime applies CDI there).
        mode = page.locator(f"[data-node='{segs['amy']['node']}'] [data-device-mode='legacy']")
        assert "cards through NVIDIA_VISIBLE_DEVICES" in mode.inner_text()

        # Usage beside each slice, from the node's device plugin: amy's notebook holds 6.8 GiB
        # (past her 5 GiB) and keeps 37% of the card busy; bo's has done nothing on the GPU.
        claim = claim_usage(notebook_nodes, local_cluster, "amy", segs["amy"]["card"], mib=6963, util=37)
        try:
            page.wait_for_selector(".seg.alloc[data-user=amy][data-sm-util='37']", timeout=60_000)
            page.wait_for_selector(
                ".seg.alloc[data-user=bo][data-gpu-idle=true]", timeout=(GPU_IDLE_AFTER + 60) * 1000
            )
            amy = page.locator(".seg.alloc[data-user=amy]")
            assert (
                amy.get_attribute("data-used-mib") == "6963"
                and amy.get_attribute("data-over-slice") == "true"
            )
            assert "6.8 GiB held · 37% busy" in amy.inner_text() and "over its slice" in amy.inner_text()
            assert amy.get_attribute("data-gpu-idle") == "false"
            bo = page.locator(".seg.alloc[data-user=bo]")
            assert "0.0 GiB held · 0% busy" in bo.inner_text() and "idle on the GPU" in bo.inner_text()
            assert page.locator("#gpu-idle-count").inner_text() == "1"
            assert page.locator("#over-slice-count").inner_text() == "1"
            page.screenshot(path=str(OUT / "dashboard.png"), full_page=True)
            # The same in api/v1/ledger and, per hub user, in the metrics.
            status, doc = hub.request(
                "GET", f"{hub.url}/services/{SERVICE}/api/v1/ledger", hub.user_token(SERVICE_ADMIN)
            )
            assert status == 200, doc
            mine = {a["hub_user"]: a for a in doc["allocations"]}
            assert (mine["amy"]["used_mib"], mine["amy"]["sm_util"], mine["amy"]["over_slice"]) == (
                6963,
                37,
                True,
            )
            assert mine["amy"]["gpu_idle_seconds"] is None and not mine["amy"]["gpu_idle"]
            assert mine["bo"]["gpu_idle"] and mine["bo"]["gpu_idle_seconds"] >= GPU_IDLE_AFTER, mine["bo"]
            assert doc["gpu_idle_after"] == GPU_IDLE_AFTER
            status, text = hub.request("GET", f"{hub.url}/services/{SERVICE}/metrics", SCRAPER_TOKEN)
            assert status == 200
            users = {
                (f.name, sample.labels.get("user")): sample.value
                for f in text_string_to_metric_families(text)
                for sample in f.samples
            }
            assert users[("gpushare_user_gpu_idle_slices", "bo")] == 1, text
            assert users[("gpushare_user_gpu_memory_used_bytes", "amy")] == 6963 * 2**20, text
            assert users[("gpushare_user_slices_over_size", "amy")] == 1, text
        finally:
            claim.unlink()

        # Hibernation: where the node's plugin overcommits (its book on the Node, written here as
        # the plugin writes it), the card says its sums and amy's slice since when it sleeps.
        show_hibernation(page, local_cluster, segs["amy"])

        # Filter by user: only amy's card, and on it only her slice stands out.
        page.select_option("#f-user", "amy")
        page.wait_for_function("document.querySelectorAll('.seg.alloc:not(.dim)').length === 1")
        bright = [s for s in segments(page) if s["dim"] == "no"]
        assert [s["user"] for s in bright] == ["amy"], bright
        assert {s["card"] for s in segments(page)} == {segs["amy"]["card"]}
        assert "user=amy" in page.url
        page.screenshot(path=str(OUT / "dashboard-filtered.png"), full_page=True)
        page.select_option("#f-user", "")
        # By node and by model: only that node's box; a model no card has leaves no card.
        page.select_option("#f-node", "nb-1")
        page.wait_for_function("document.querySelectorAll('section.node').length === 1")
        assert page.locator("section.node").get_attribute("data-node") == "nb-1"
        page.select_option("#f-node", "")
        page.select_option("#f-model", "Tesla-T4")
        page.wait_for_url("**model=Tesla-T4*")
        assert page.locator(f"[data-card='{segs['amy']['card']}'] .seg.alloc").count() == 2
        page.select_option("#f-model", "")

        # Another spawn shows up without a reload.
        spawn(hub, local_cluster, "cy", "t4-7g")
        started.append("cy")
        page.wait_for_selector(".seg.alloc[data-user=cy]", timeout=60_000)
        assert page.evaluate("window.__sameDocument") is True
        cy = next(s for s in segments(page) if s["user"] == "cy")
        assert cy["slice"] == "t4-7g" and cy["card"] != segs["amy"]["card"]
        page.screenshot(path=str(OUT / "dashboard-after-spawn.png"), full_page=True)
    finally:
        local_cluster.core_api().delete_node(BROKEN)
        for user in started:
            stop_server(hub, local_cluster, user)


def test_non_admin_gets_the_403_page_naming_the_missing_scope(hub, browser_page):
    page = browser_page
    login(page, hub.url, "pia-viewer")
    page.goto(f"{hub.url}/hub/home")
    page.click("text=Services")  # every user may open the service: availability and their own slices
    page.click("a.dropdown-item:has-text('GPU slices')")
    page.wait_for_selector("#gpushare-error")
    text = page.locator("#gpushare-error").inner_text()
    assert "custom:gpushare:admin" in text and "pia-viewer" in text, text
    assert page.locator(".seg").count() == 0
    page.screenshot(path=str(OUT / "dashboard-403.png"), full_page=True)


def test_a_hub_admin_sees_the_dashboard_and_its_api_takes_the_cookie_only_from_the_page(hub, browser_page):
    """A hub admin without the service's custom scope: the dashboard's OAuth token carries
    admin-ui (JupyterHub's admin role; the service's OAuth client may ask for it), so the page
    opens and its own calls (the cookie with the page's XSRF token) read the ledger. The same
    cookie on the API without the token, as a link would send it, gets the 403 naming it."""
    hub.api("POST", "/users/hub-chief")
    status, body = hub.api("PATCH", "/users/hub-chief", {"admin": True})
    assert status == 200 and body["admin"] is True, (status, body)
    page = browser_page
    login(page, hub.url, "hub-chief")
    page.goto(f"{hub.url}/services/{SERVICE}/")
    page.wait_for_function(
        "document.querySelector('.summary') && /Tesla-T4/.test(document.querySelector('.summary').innerText)"
    )
    assert page.locator("#gpushare-error").count() == 0
    answer = page.goto(f"{hub.url}/services/{SERVICE}/api/v1/ledger")
    assert answer is not None and answer.status == 403, answer and answer.status
    assert "XSRF" in json.loads(answer.text())["message"]
