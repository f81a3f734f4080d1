"""Every route of the hub service says what its methods need with ``@requires`` (the base
handler's one check), each resource module ends in its handler list, and the admin routes need
the admin scope on the token (the checks themselves are proven through HTTP in
test_service_tokens.py and the fuzz tier)."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare_hub.service.handlers import handler_list
from gpushare_hub.service.handlers.base import ADMIN, METRICS, BaseHandler, requires
from gpushare_hub.service.handlers.pages import DashboardHandler, OAuthCallbackHandler

pytestmark = pytest.mark.unit

# The page (a navigation: it redirects to the login first) and JupyterHub's OAuth callback check
# their callers themselves.
OWN_CHECKS = {DashboardHandler, OAuthCallbackHandler}


def needs(routes: list[tuple[str, Any]]) -> dict[tuple[str, str], str | None]:
    """(path, method) -> the setting whose scope the method requires (None: any caller)."""
    found = {}
    for path, handler in routes:
        if handler in OWN_CHECKS:
            continue
        for name in ("get", "post", "put", "patch", "delete"):
            method = handler.__dict__.get(name)
            if method is not None:
                assert hasattr(method, "requires"), f"{handler.__name__}.{name} ({path}) has no @requires"
                found[(path, name)] = method.requires
    return found


def test_every_routed_method_says_what_it_requires_and_the_admin_routes_require_the_admin_scope():
    assert needs(handler_list()) == {
        ("metrics", "get"): METRICS,
        ("api/v1/ledger", "get"): ADMIN,
        ("api/v1/availability", "get"): None,
        ("api/v1/me", "get"): None,
        ("api/v1/me/keep", "post"): None,
        ("api/v1/budgets", "get"): ADMIN,
        ("api/v1/budgets/([^/]+)", "post"): ADMIN,
        ("api/v1/history", "get"): ADMIN,
        ("api/v1/planning", "get"): ADMIN,
    }


def test_the_check_runs_before_the_method_and_a_method_without_it_is_found():
    ran: list[str] = []

    class Checked(BaseHandler):
        def check_access(self, setting, what):  # type: ignore[no-untyped-def]
            ran.append(f"check {setting}: {what}")
            raise PermissionError("refused")

        @requires(ADMIN, "Reading it")
        def get(self) -> None:
            ran.append("ran")

    with pytest.raises(PermissionError):
        Checked.get(object.__new__(Checked))
    assert ran == ["check admin_scope: Reading it"]  # the method never ran

    class Unchecked(BaseHandler):
        def get(self) -> None: ...

    with pytest.raises(AssertionError, match="has no @requires"):
        needs([("x", Unchecked)])
