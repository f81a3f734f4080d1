"""The dashboard's planning view in a browser: after a real spawn and stop, an admin asks for the
hub's history replayed on 2 to 12 cards with two catalogues; the page shows one row per what-if,
marks the fewest cards where at most 5% of spawns wait, and says what it replayed. A bad range
is refused with the service's words. Screenshot: out/browser/dashboard-planning.png (and, with
GPUSHARE_DOCS_IMAGES=docs/images, the docs' picture)."""

from __future__ import annotations

from tests.conftest import wait_for
from tests.support.hub_helpers import SERVICE, SERVICE_ADMIN, start_server, stop_server
from tests.support.pictures import picture

from .conftest import login


def test_an_admin_replays_the_history_on_the_dashboard_and_sees_the_pick(
    local_cluster, hub, notebook_nodes, browser_page
):
    user, page = "plan-page-ann", browser_page
    start_server(hub, user, "t4-5g")
    stop_server(hub, local_cluster, user)

    login(page, hub.url, SERVICE_ADMIN)
    page.goto(f"{hub.url}/services/{SERVICE}/")
    page.wait_for_selector("#planning")
    assert page.locator("#plan-table").count() == 0  # nothing is computed until asked
    page.fill("#plan-cards", "2..12")
    page.fill("#plan-catalogue", "3,5,7;5,10")
    page.click("#plan-submit")
    page.wait_for_selector("#plan-table")
    result = page.locator("#plan-result").inner_text()
    assert " spawns since " in result and "× Tesla-T4" in result, result
    rows = page.locator("#plan-table tr[data-cards]")
    assert rows.count() == 22
    cells = [rows.nth(i).get_attribute("data-catalogue") for i in range(22)]
    assert cells == ["3,5,7"] * 11 + ["5,10"] * 11
    # This session's notebooks fit twelve cards many times over: each catalogue has its pick.
    picks = page.locator("#plan-table tr.pick")
    assert wait_for(lambda: picks.count() == 2, timeout=60), page.content()
    assert "at most 5% of spawns wait" in str(picks.first.get_attribute("title"))
    picture(page.locator("#planning"), "dashboard-planning.png")

    page.fill("#plan-cards", "1..500")
    page.click("#plan-submit")
    page.wait_for_selector("#plan-result.error")
    words = page.locator("#plan-result").inner_text()
    assert words.startswith("not replayed (HTTP 400):") and "ask for at most 64" in words, words
    assert page.locator("#plan-table").count() == 1  # the last answer stays
