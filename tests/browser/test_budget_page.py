"""GiB-hour budgets in a browser: a member of the budget group (0 GiB·h a week until an admin adds
some) sees on the spawn form that the budget is spent and when it resets, and Start is refused
with the same words; the admin adds GiB·h on the GPU slices dashboard; the user's form then
prices the slice against the budget ("a 5 GiB slice for 8 h would use 40") and Start starts it.
Screenshots: out/browser/spawn-budget-spent.png, spawn-budget-refused.png, dashboard-budgets.png,
spawn-budget.png; with GPUSHARE_DOCS_IMAGES=docs/images also the docs' pictures of the form and of
the dashboard's budgets."""

from __future__ import annotations

import re

from tests.support.hub_helpers import BUDGET_USERS, SERVICE, SERVICE_ADMIN, stop_server
from tests.support.pictures import picture

from .conftest import OUT, login


def test_a_spent_budget_on_the_form_then_an_admins_addition_on_the_dashboard_lets_the_spawn_through(
    local_cluster, hub, notebook_nodes, browser_page
):
    page, user = browser_page, BUDGET_USERS[1]
    started = False
    try:
        login(page, hub.url, user)
        page.goto(f"{hub.url}/hub/spawn")
        banner = page.locator("#gpushare-budget")
        banner.wait_for()
        words = banner.inner_text()
        assert "alert-warning" in str(banner.get_attribute("class"))
        assert words.startswith("Your GPU budget is spent: 0 of 0 GiB·h used this week."), words
        assert re.search(r"It resets Monday \d+ \w+ 00:00 UTC", words), words
        assert "ask an admin to add GiB·h" in words
        page.screenshot(path=str(OUT / "spawn-budget-spent.png"), full_page=True)

        page.check("input[name=profile][value=t4-5g]")
        page.click("input[type=submit], button[type=submit]")
        page.wait_for_selector("text=your GPU budget is spent")
        assert "It resets Monday" in page.content()
        page.screenshot(path=str(OUT / "spawn-budget-refused.png"), full_page=True)

        # The admin adds 1 GiB·h on the dashboard, in a browser of their own.
        admin = page.context.browser.new_context(viewport={"width": 1100, "height": 900}).new_page()
        login(admin, hub.url, SERVICE_ADMIN)
        admin.goto(f"{hub.url}/services/{SERVICE}/")
        admin.wait_for_selector("#budgets:not([hidden])")
        assert "this week · resets Monday" in admin.locator("#budget-window").inner_text()
        admin.fill("#budget-amount", "1")
        admin.fill("#budget-user", user)
        admin.click("#budget-submit")
        result = admin.locator("#budget-result")
        admin.wait_for_function("document.getElementById('budget-result').textContent.startsWith('added')")
        assert result.inner_text() == f"added 1 GiB·h to {user}: 0 of 1 GiB·h (with 1 added) used this week"
        row = admin.locator(f"#budgets-table tr[data-user='{user}']")
        row.wait_for()
        assert row.get_attribute("data-spent") == "false" and row.get_attribute("data-left") == "1"
        admin.screenshot(path=str(OUT / "dashboard-budgets-page.png"), full_page=True)
        picture(admin.locator("#budgets"), "dashboard-budgets.png")
        # A figure below zero is stopped by the form itself (the API refuses it too: hub tier).
        admin.fill("#budget-amount", "-3")
        admin.click("#budget-submit")
        assert admin.locator("#budget-amount").evaluate("e => e.validity.rangeUnderflow") is True
        assert result.inner_text().startswith(f"added 1 GiB·h to {user}")

        # The user's form now prices the slice against what is left, and Start starts it.
        page.goto(f"{hub.url}/hub/spawn")
        banner = page.locator("#gpushare-budget")
        banner.wait_for()
        assert banner.inner_text() == (
            "0 of 1 GiB·h (with 1 added) used this week; a 5 GiB slice for 8 h would use 40 "
            "(1 left: about 12 min of it)."
        )
        assert "alert-info" in str(banner.get_attribute("class"))
        picture(page.locator("form").first, "spawn-budget.png")
        page.check("input[name=profile][value=t4-5g]")
        page.click("input[type=submit], button[type=submit]")
        started = True
        page.wait_for_url(f"**/user/{user}/**", timeout=400_000)
        hub.wait_ready(user)
    finally:
        if started:
            stop_server(hub, local_cluster, user)
