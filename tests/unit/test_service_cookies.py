"""The hub's login cookie opens the dashboard's page; the API takes it only with the page's XSRF
token (issue 35: JupyterHub takes a cookie without one on a navigation or a same-origin image, so
a link or an image in a notebook an admin opens could call ``api/v1/planning`` with the admin's
cookie). Through the service's real application and HubOAuth, against a fake hub (tests/support)."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.hubservice import ServiceUnderTest, own_token

API = ["api/v1/ledger", "api/v1/availability", "api/v1/me", "api/v1/budgets", "api/v1/history", "metrics"]
# What a browser says of the request: a link followed, an image of a page on the hub's own
# origin, one of another site's page, a script's fetch(); none of these (a script, curl).
FETCHES = [
    {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "same-origin"},
    {"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Site": "same-origin"},
    {"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Mode": "cors", "Sec-Fetch-Site": "same-origin"},
    {},
]


@pytest.fixture
def browser(hub_service: ServiceUnderTest) -> ServiceUnderTest:
    hub_service.callers["boss-oauth"] = {
        **own_token("boss", admin=True),
        "scopes": ["access:services!service=gpushare", "custom:gpushare:admin", "admin-ui"],
    }
    return hub_service


def page_xsrf(svc: ServiceUnderTest, cookie: str) -> str:
    """The XSRF token the dashboard's page gives its own calls (``SETTINGS.xsrf``)."""
    status, page = svc.call("GET", "", None, Cookie=cookie, **{"Sec-Fetch-Mode": "navigate"})
    assert status == 200, (status, page)
    found = re.search(r'"xsrf": ("[^"]*")', page)
    assert found, page[:500]
    return str(json.loads(found.group(1)))


@pytest.mark.parametrize("fetch", FETCHES, ids=lambda f: "-".join(f.values()) or "unspecified")
@pytest.mark.parametrize("route", [*API, "api/v1/planning?cards=1..4"])
def test_the_api_refuses_an_admins_cookie_without_the_pages_xsrf_token(browser, route, fetch):
    status, body = browser.call("GET", route, None, Cookie=browser.cookie("boss-oauth"), **fetch)
    assert status in (401, 403), (route, fetch, status, body)
    if status == 403:  # a cookie the hub would take: the message says what the API takes instead
        assert "XSRF" in body["message"] and "Authorization: token" in body["message"], body


def test_a_planning_link_fired_with_the_cookie_starts_no_plan(browser):
    browser.service.planning_lock  # noqa: B018 - made on first use, as the handler makes it
    started: list[object] = []
    plan = browser.service.planning_lock.acquire
    browser.service.planning_lock.acquire = lambda: started.append(1) or plan()  # type: ignore[method-assign]
    status, _ = browser.call(
        "GET",
        "api/v1/planning?cards=1..4",
        None,
        Cookie=browser.cookie("boss-oauth"),
        **{"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Site": "same-origin"},
    )
    assert status == 403 and not started


def test_the_dashboards_page_and_its_own_calls_take_the_cookie(browser):
    cookie = browser.cookie("boss-oauth")
    token = page_xsrf(browser, cookie)
    with_xsrf = {"Cookie": f"{cookie}; _xsrf={token}", "X-XSRFToken": token, "Sec-Fetch-Mode": "cors"}
    for route in API:
        status, body = browser.call("GET", route, None, **with_xsrf)
        assert status == 200, (route, status, body)
    # A wrong token, or the right one from another browser's session, is no token.
    for bad in [token[:-2] + "xx", "", "é"]:
        status, body = browser.call("GET", "api/v1/ledger", None, **{**with_xsrf, "X-XSRFToken": bad})
        assert status in (401, 403), (bad, status, body)
    other = cookie.replace("session-1", "session-2")
    status, body = browser.call(
        "GET", "api/v1/ledger", None, **{**with_xsrf, "Cookie": f"{other}; _xsrf={token}"}
    )
    assert status in (401, 403), (status, body)


def test_a_token_needs_no_xsrf_token_whatever_cookie_comes_with_it(browser):
    status, body = browser.call("GET", "api/v1/ledger", "boss-oauth", Cookie=browser.cookie("nobody"))
    assert status == 200, (status, body)
