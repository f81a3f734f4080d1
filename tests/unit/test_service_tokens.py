"""The hub service authorises on the token's own scopes, never on its owner's ``admin`` flag
(issue 35): an admin's notebook-server token is no gpushare admin; a server token may call
``api/v1/me`` and Keep for its own user and nothing else; ``api/v1/me`` answers for users only.
Through the service's real application and HubOAuth, against a fake hub (tests/support)."""

from __future__ import annotations

import pytest

from tests.support.hubservice import ServiceUnderTest, own_token, server_token, service_token

ADMIN_ROUTES = ["api/v1/ledger", "api/v1/budgets", "api/v1/history", "api/v1/planning", "metrics"]


@pytest.fixture
def tokens(hub_service: ServiceUnderTest) -> ServiceUnderTest:
    hub_service.callers.update(
        {
            "alice-own": own_token("alice"),
            "alice-server": server_token("alice"),
            "boss-own": own_token("boss", admin=True),
            "boss-server": server_token("boss", admin=True),
            "boss-narrow": {**own_token("boss", admin=True), "scopes": ["access:services!service=gpushare"]},
            "gpushare-admin": {
                **own_token("carl"),
                "scopes": [*own_token("carl")["scopes"], "custom:gpushare:admin"],
            },
            "scraper": service_token("scraper", ["custom:gpushare:metrics"]),
        }
    )
    return hub_service


@pytest.mark.parametrize("route", ADMIN_ROUTES)
@pytest.mark.parametrize("token", ["boss-server", "boss-narrow"])
def test_an_admin_users_token_without_an_admin_scope_of_its_own_is_refused(tokens, token, route):
    """The hub says ``admin: true`` for both (the owner is a hub admin); neither token holds an
    admin scope, so neither reads every user's slices, budgets, history or plans."""
    status, body = tokens.call("GET", route, token)
    assert status == 403, (token, route, status, body)
    assert "custom:gpushare" in body["message"], body


@pytest.mark.parametrize("route", ["api/v1/ledger", "api/v1/budgets", "metrics"])
@pytest.mark.parametrize("token", ["boss-own", "gpushare-admin"])
def test_a_token_holding_an_admin_scope_itself_reads_the_admin_routes(tokens, token, route):
    status, body = tokens.call("GET", route, token)
    assert status == 200, (token, route, status, body)


def test_a_budget_addition_by_an_admins_server_token_is_refused_and_adds_nothing(tokens):
    status, body = tokens.call("POST", "api/v1/budgets/alice", "boss-server", b'{"add_gib_hours": 20}')
    assert status == 403 and "notebook server's own token" in body["message"], body


@pytest.mark.parametrize("token", ["alice-server", "boss-server"])
def test_a_server_token_calls_me_and_keep_for_its_own_user_and_nothing_else(tokens, token):
    owner = token.split("-")[0]
    status, me = tokens.call("GET", "api/v1/me", token)
    assert status == 200 and me["user"] == owner, (status, me)
    status, body = tokens.call("POST", "api/v1/me/keep", token, b'{"server": ""}')
    assert status == 404 and "nothing to keep" in body["message"], body  # reached Keep itself
    for route in ["api/v1/availability", "api/v1/ledger", "metrics"]:
        status, body = tokens.call("GET", route, token)
        assert status == 403 and "api/v1/me" in body["message"], (route, status, body)


def test_a_users_own_token_reads_availability_and_me(tokens):
    assert tokens.call("GET", "api/v1/availability", "alice-own")[0] == 200
    status, me = tokens.call("GET", "api/v1/me", "alice-own")
    assert status == 200 and me["user"] == "alice", me


@pytest.mark.parametrize(("method", "route"), [("GET", "api/v1/me"), ("POST", "api/v1/me/keep")])
def test_me_and_keep_answer_for_users_only_not_for_a_services_token(tokens, method, route):
    status, body = tokens.call(method, route, "scraper", b"{}" if method == "POST" else None)
    assert status == 403 and "hub user" in body["message"] and "scraper" in body["message"], body
    # The scraper still reads what it is for.
    assert tokens.call("GET", "metrics", "scraper")[0] == 200


@pytest.mark.parametrize("route", ADMIN_ROUTES)
def test_a_token_is_authorised_before_its_query_is_read(tokens, route):
    """A refused caller learns nothing of the parameters: 403, whatever the query (as
    JupyterHub's ``@needs_scope`` refuses before the handler runs)."""
    status, body = tokens.call("GET", f"{route}?colour=red&cards=%C2%B2", "alice-own")
    assert status == 403 and "custom:gpushare" in body["message"], (route, status, body)
