"""What every handler of the service shares: :class:`BaseHandler`, the body limit, the error page.

The handlers read the running service as :class:`RunningService` describes it: the
application (:class:`~gpushare_hub.service.app.GPUShareService`) imports the handlers, so they
do not import it.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from html import escape
from typing import Any, Protocol, TypeVar, cast

from jupyterhub.services.auth import HubOAuthenticated  # type: ignore[import-untyped]
from jupyterhub.utils import url_path_join  # type: ignore[import-untyped]
from tornado import web

from gpushare_hub.accounting.book import Book
from gpushare_hub.core.catalogue import Catalogue
from gpushare_hub.web.bodylimit import LimitedBody

from ..access import COOKIE_REFUSAL, SERVER, SERVICE, Caller, refusal, xsrf_sent
from ..budgets import BudgetPolicy, BudgetRule
from ..enforcement import Enforcement
from ..idle import IdleRule
from ..idlepolicy import IdlePolicy
from ..overslice import OverSlicePolicy
from ..query import Filters, QueryError, parse_query, query_values
from ..sources import Cluster, HubServers
from ..view import ledger_document

# The largest request body (Keep's and a budget addition's JSON need a few dozen bytes).
MAX_BODY_BYTES = 4096


class RunningService(Protocol):
    """What the handlers read of the running service: its settings, the rules
    ``initialize`` built and the stores ``run`` opened (``make_app`` has the type checker
    check that :class:`~gpushare_hub.service.app.GPUShareService` holds all of it)."""

    @property
    def admin_scope(self) -> str: ...
    @property
    def metrics_scope(self) -> str: ...
    @property
    def node_selector(self) -> dict[str, Any]: ...
    @property
    def quota_gib_per_group(self) -> dict[str, Any]: ...
    @property
    def refresh_seconds(self) -> int: ...
    @property
    def gpu_idle_after(self) -> int: ...
    @property
    def planning_lock(self) -> asyncio.Lock: ...

    catalogue: Catalogue
    idle_rule: IdleRule
    budget_rule: BudgetRule
    enforcement: Enforcement
    book: Book
    idle: IdlePolicy
    budgets: BudgetPolicy
    over: OverSlicePolicy


# The scopes a route may require, named by the service's setting that holds each.
ADMIN, METRICS = "admin_scope", "metrics_scope"

Method = TypeVar("Method", bound=Callable[..., Any])


def requires(setting: str | None = None, what: str = "") -> Callable[[Method], Method]:
    """A handler method that answers only a caller whose token holds the scope in the service's
    ``setting`` (:data:`ADMIN`, :data:`METRICS`; None: any caller its class lets in, see
    ``server_tokens`` and ``users_only``): 401 or 403 before the method runs, the refusal naming
    ``what`` was refused and the scope. Every route's methods say what they need this way."""

    def wrap(method: Method) -> Method:
        if inspect.iscoroutinefunction(method):

            @functools.wraps(method)
            async def checked_async(self: BaseHandler, *args: Any, **kwargs: Any) -> Any:
                self.check_access(setting, what)
                return await method(self, *args, **kwargs)

            checked_async.requires = setting  # type: ignore[attr-defined]
            return cast(Method, checked_async)

        @functools.wraps(method)
        def checked(self: BaseHandler, *args: Any, **kwargs: Any) -> Any:
            self.check_access(setting, what)
            return method(self, *args, **kwargs)

        checked.requires = setting  # type: ignore[attr-defined]
        return cast(Method, checked)

    return wrap


class BaseHandler(HubOAuthenticated, LimitedBody):  # type: ignore[misc]
    """Who calls, what they may see; errors as JSON (API) or a short page. A body past
    :data:`MAX_BODY_BYTES` is refused with 413 as it streams in, before the caller is known.

    The hub's login cookie (the dashboard's OAuth token) is taken on a page's navigation
    (:attr:`cookie_without_xsrf`); the API takes it only with the page's XSRF token in
    ``X-XSRFToken``, as the dashboard's own calls send it
    (:func:`~gpushare_hub.service.access.xsrf_sent`), so that a link or an image in a notebook
    an admin opens cannot call the API with the admin's cookie."""

    cookie_without_xsrf = False
    _cookie_refused = False

    def prepare(self) -> None:
        super().prepare()
        self.start_body()

    def get_current_user(self) -> dict[str, Any] | None:
        user = super().get_current_user()
        if (
            user
            and not self.cookie_without_xsrf
            and not getattr(self, "_token_authenticated", False)  # HubAuth: the cookie's
            and not xsrf_sent(self.request.headers, lambda: self.xsrf_token)
        ):
            self._cookie_refused = True
            return None
        return user  # type: ignore[no-any-return]

    def body_too_large(self, size: int, limit: int) -> None:
        said = f"the body has {size} bytes, more than {limit}; the service's requests are small JSON objects"
        self.send_error(413, exc_info=(web.HTTPError, web.HTTPError(413, said), None))

    json_errors = True
    _not_allowed: dict[str, Any] | None = None

    @property
    def service(self) -> RunningService:
        return self.settings["service"]  # type: ignore[no-any-return]

    @property
    def cluster(self) -> Cluster:
        return self.settings["cluster"]  # type: ignore[no-any-return]

    @property
    def hub(self) -> HubServers:
        return self.settings["hub"]  # type: ignore[no-any-return]

    def check_hub_user(self, model: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return super().check_hub_user(model)  # type: ignore[no-any-return]
        except Exception:
            self._not_allowed = model
            raise

    # Whether a notebook server's own token may call this route (api/v1/me and Keep only), and
    # whether the route answers for a hub user only (a service's token is refused).
    server_tokens = False
    users_only = False

    def who(self) -> Caller:
        """The caller (:class:`~gpushare_hub.service.access.Caller`), from the token's own scopes."""
        return Caller.of(self.current_user or {})

    def is_admin(self) -> bool:
        return self.who().is_admin(self.service.admin_scope)

    def caller(self) -> dict[str, Any]:
        """The caller's model; 401 (no valid token) or 403 (no access scope, a server token on a
        route not open to it, a service on a route for users) otherwise."""
        user = self.current_user
        if user:
            who = self.who()
            if who.kind == SERVER and not self.server_tokens:
                raise web.HTTPError(403, refusal(who, "This route", self.service.admin_scope))
            if who.kind == SERVICE and self.users_only:
                raise web.HTTPError(
                    403,
                    f"this route answers for a hub user, and the token is the service {who.name!r}'s; "
                    "call it with a user's token (or from their notebook server)",
                )
            return user  # type: ignore[no-any-return]
        if self._cookie_refused:
            raise web.HTTPError(403, COOKIE_REFUSAL)
        if self._not_allowed is not None:
            raise web.HTTPError(
                403,
                f"{self._not_allowed.get('name')} may not use this service: it needs the scope "
                f"access:services!service={self.settings['service_name']}",
            )
        raise web.HTTPError(
            401,
            "no valid hub token: the token is missing, invalid or expired; send "
            "'Authorization: token <hub API token>' with a current token, or log in to the hub again",
        )

    def require(self, scope: str, what: str) -> None:
        who = self.who()
        if not who.may(scope, self.service.admin_scope):
            raise web.HTTPError(403, refusal(who, what, scope))

    def check_access(self, setting: str | None, what: str) -> None:
        """What :func:`requires` checks before a method runs."""
        self.caller()
        if setting is not None:
            self.require(getattr(self.service, setting), what)

    def filters(self, allowed: tuple[str, ...]) -> Filters:
        """The ledger's filters from the query (``query.parse_query``); 400 naming a wrong one."""
        try:
            return parse_query(self.request.query_arguments, allowed)
        except QueryError as err:
            raise web.HTTPError(400, str(err)) from err

    def query_args(
        self, choices: Mapping[str, tuple[str, ...]], times: tuple[str, ...] = (), texts: tuple[str, ...] = ()
    ) -> dict[str, Any]:
        """The query's values (``query.query_values``); 400 naming a wrong one."""
        try:
            return query_values(self.request.query_arguments, choices, times, texts)
        except QueryError as err:
            raise web.HTTPError(400, str(err)) from err

    def ledger_doc(self, filters: Filters | None = None) -> dict[str, Any]:
        doc = ledger_document(
            self.cluster.report(),
            self.hub.servers,
            self.service.catalogue,
            datetime.now(UTC),
            filters or Filters(),
            stale_seconds=self.cluster.stale_for(),
            gpu_idle_after=self.service.gpu_idle_after,
        )
        if self.hub.error:  # start and activity are then the last ones read
            doc["warnings"].append(self.hub.error)
        self.hub.read_soon({(a["hub_user"], a["server"]) for a in doc["allocations"] if a["hub_user"]})
        return doc

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        message = (exc.log_message if isinstance(exc, web.HTTPError) else None) or self._reason
        if self.json_errors:
            self.set_header("Content-Type", "application/json; charset=UTF-8")
            self.finish(json.dumps({"status": status_code, "message": message}))
            return
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.finish(ERROR_PAGE.format(status=status_code, message=escape(message), home=escape(hub_home())))

    def json_body(self, example: str, empty: bytes) -> Any:
        """The request's body (at most :data:`MAX_BODY_BYTES`) as JSON (``empty`` stands for no
        body); 400 saying to send ``example`` when it is not JSON."""
        raw = self.body or empty
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # nesting deeper than the parser's stack: not ours
            raise web.HTTPError(400, f"the body is not JSON; send {example}") from None

    def send(self, doc: Any) -> None:
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(doc, indent=1))


ERROR_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>GPU slices: {status}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font-family:system-ui,sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem;color:#222}}
h1{{font-size:1.4rem}} .msg{{background:#fdecea;border-left:4px solid #a94442;padding:.8rem 1rem}}</style>
</head><body><h1>GPU slices: {status}</h1><p class="msg" id="gpushare-error">{message}</p>
<p><a href="{home}">Back to the hub</a></p></body></html>
"""


def hub_home() -> str:
    """The hub's home page, under the hub's base URL (JupyterHub gives it to its services)."""
    return url_path_join(os.environ.get("JUPYTERHUB_BASE_URL", "/"), "hub/home")  # type: ignore[no-any-return]
