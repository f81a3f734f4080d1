"""What is not the JSON API: the dashboard page, ``metrics`` (Prometheus' text), JupyterHub's
OAuth callback, the prefix's redirect and the 404 of every path no route matches."""

from __future__ import annotations

import json
from importlib.resources import files

# Handlers and the OAuth callback share HubOAuth.instance(), which keeps the OAuth (PKCE) states.
from jupyterhub.services.auth import HubOAuthCallbackHandler  # type: ignore[import-untyped]
from tornado import web
from tornado.httputil import url_concat

from ..metrics import render_metrics
from ..query import FILTER_KEYS
from ..waiting import pending_labels
from .base import METRICS, BaseHandler, hub_home, requires
from .budgets import budget_groups


class MetricsHandler(BaseHandler):
    @requires(METRICS, "Reading the metrics")
    async def get(self) -> None:
        self.filters(())
        labels = pending_labels(self.cluster.pending(), self.cluster.ledger())
        svc = self.service
        configured = svc.budget_rule.configured
        budgets = svc.budgets.everyone(await budget_groups(svc, self.hub)) if configured else None
        body = render_metrics(self.ledger_doc(), self.hub.groups, svc.quota_gib_per_group, labels, budgets)
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(body)


class NotFoundHandler(BaseHandler):
    """Every path no route matches (the application's default handler): 404 for any method."""

    def get(self, *_: str) -> None:
        raise web.HTTPError(
            404,
            "no such endpoint; the API has api/v1/ledger, api/v1/availability, api/v1/me, "
            "api/v1/me/keep, api/v1/budgets, api/v1/budgets/<user>, api/v1/history and api/v1/planning",
        )

    post = put = patch = delete = head = options = get


class ToPrefixHandler(BaseHandler):
    """The service's prefix without its slash: the dashboard, the query kept (as tornado's
    ``RedirectHandler`` did; this one refuses a large body as every route does)."""

    cookie_without_xsrf = True

    def get(self) -> None:
        pairs = [
            (k, v.decode(errors="replace")) for k, vs in self.request.query_arguments.items() for v in vs
        ]
        self.redirect(url_concat(self.settings["prefix"], pairs) if pairs else self.settings["prefix"], True)


class OAuthCallbackHandler(HubOAuthCallbackHandler, BaseHandler):  # type: ignore[misc]
    """JupyterHub's OAuth callback, refusing a large body as every route does; its errors are a
    short page (it is a browser's navigation)."""

    cookie_without_xsrf = True
    json_errors = False


class DashboardHandler(BaseHandler):
    json_errors = False
    cookie_without_xsrf = True  # the page's navigation; its own calls send the XSRF token

    def get(self) -> None:
        if not self.current_user:
            if self._not_allowed is None:
                self.redirect(self.get_login_url())
                return
            self.caller()
        svc = self.service
        if not self.is_admin():
            raise web.HTTPError(
                403,
                f"The GPU slices dashboard needs the scope {svc.admin_scope} (or a hub admin's "
                "admin-ui) on the token, "
                f"which {self.current_user.get('name')}'s token does not hold. Ask a hub admin to grant it; "
                "meanwhile api/v1/availability and api/v1/me answer for you.",
            )
        filters = self.filters((*FILTER_KEYS, "refresh"))
        page = files("gpushare_hub.service").joinpath("static/dashboard.html").read_text()
        settings = {
            "refresh": filters.refresh or svc.refresh_seconds,
            "filters": {"node": filters.node, "model": filters.model, "user": filters.user},
            "user": self.current_user.get("name"),
            "home": hub_home(),
            # HubOAuth accepts the cookie on the page's own fetch() calls only with this token.
            "xsrf": self.xsrf_token.decode() if isinstance(self.xsrf_token, bytes) else self.xsrf_token,
        }
        self.set_header("Cache-Control", "no-store")
        self.finish(page.replace("/*SETTINGS*/{}", json.dumps(settings).replace("<", "\\u003c")))


# The prefix itself (the dashboard), then the others; the prefix without its slash and every
# other path are routed by the app (ToPrefixHandler, NotFoundHandler).
handlers = [("", DashboardHandler), ("metrics", MetricsHandler), ("oauth_callback", OAuthCallbackHandler)]
