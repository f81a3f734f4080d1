"""Who calls the hub service, and what the token they sent may do here.

JupyterHub answers ``GET /hub/api/user`` for a token with its owner's model and, in
``scopes``, the token's own scopes (expanded). The model's ``admin`` flag is the *owner's*: it is
true for every token of an admin user, whatever that token may do, so it is never read here. As
JupyterHub's own ``@needs_scope`` handlers do, the service authorises on the token's scopes only:

- **admin** routes (the dashboard, ``api/v1/ledger``, ``budgets``, ``history``, ``planning``)
  need the service's admin scope (``custom:<name>:admin``) or one of :data:`HUB_ADMIN_SCOPES`
  on the token, unfiltered: JupyterHub's ``admin`` role grants both, a user's ``self`` and a
  server's ``server`` role neither;
- ``metrics`` needs the metrics scope or what an admin route needs;
- a **server token** (:func:`is_server_token`: the token a notebook server gets, confined to
  that server) may call ``api/v1/me`` and ``api/v1/me/keep``, for its own user, and nothing else,
  so that code running in an admin's notebook is no gpushare admin;
- ``api/v1/me`` and Keep answer for a hub **user**: a service's token is refused.

The hub's login cookie (the dashboard's OAuth token) is taken on the dashboard's page, and on
the API only with the page's XSRF token (:func:`xsrf_sent`): JupyterHub takes a cookie without
one on a navigation or a same-origin image, which a notebook an admin opens can fire.

The table of what each kind of token may do is in ``docs/security.md``.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

USER = "user"
SERVER = "server"
SERVICE = "service"
# JupyterHub's own scopes that make a token an admin of every user (its `admin` role): read
# unfiltered on the token. `admin:users` may already create, rename and delete every user;
# `admin-ui` is what the dashboard's OAuth token carries for a hub admin in a browser.
HUB_ADMIN_SCOPES = ("admin:users", "admin-ui")


def is_server_token(name: str, scopes: frozenset[str]) -> bool:
    """Whether a token of user ``name`` is confined to one of their servers: it may access a
    server by name (``access:servers!server=<name>/<server>``, JupyterHub's ``server`` role) and
    not the user's servers at large (``access:servers!user=<name>``, their ``self``) or all."""
    confined = any(s.startswith(f"access:servers!server={name}/") for s in scopes)
    wider = "access:servers" in scopes or f"access:servers!user={name}" in scopes
    return confined and not wider


@dataclass(frozen=True)
class Caller:
    """The caller as the hub named them: ``kind`` is :data:`USER`, :data:`SERVER` (a user's
    server token) or :data:`SERVICE`; ``scopes`` are the token's own."""

    name: str
    kind: str
    scopes: frozenset[str]

    @classmethod
    def of(cls, model: Mapping[str, Any]) -> Caller:
        name = str(model.get("name"))
        listed = model.get("scopes")
        scopes = frozenset(s for s in listed if isinstance(s, str)) if isinstance(listed, list) else None
        scopes = scopes or frozenset()
        if model.get("kind") == SERVICE:
            kind = SERVICE
        elif is_server_token(name, scopes):
            kind = SERVER
        else:
            kind = USER
        return cls(name, kind, scopes)

    def is_admin(self, admin_scope: str) -> bool:
        """The token itself holds the service's admin scope or a hub admin's (never a server's)."""
        if self.kind == SERVER:
            return False
        return admin_scope in self.scopes or any(s in self.scopes for s in HUB_ADMIN_SCOPES)

    def may(self, scope: str, admin_scope: str) -> bool:
        """The token holds ``scope`` or may do what an admin may (never a server's token)."""
        return self.kind != SERVER and (scope in self.scopes or self.is_admin(admin_scope))


def refusal(caller: Caller, what: str, scope: str) -> str:
    """Why ``caller`` may not do ``what``, which needs ``scope``, and what to do instead."""
    if caller.kind == SERVER:
        return (
            f"{what} is not open to a notebook server's own token, which may call api/v1/me and "
            f"api/v1/me/keep for its user only; use a token of your own that holds {scope}"
        )
    return (
        f"{what} needs the scope {scope} (or {' or '.join(HUB_ADMIN_SCOPES)}) on the token itself; "
        "ask a hub admin to grant it, then use a token that holds it"
    )


COOKIE_REFUSAL = (
    "the API takes the hub's login cookie only with the dashboard page's XSRF token (the "
    "X-XSRFToken header its own calls send), so that a link or an image cannot call it with your "
    "cookie; from a script, send 'Authorization: token <hub API token>'"
)


def xsrf_sent(headers: Mapping[str, str], expected: Callable[[], bytes | str]) -> bool:
    """Whether the request's ``X-XSRFToken`` (or ``X-CSRFToken``) header is the page's XSRF token,
    ``expected()`` (JupyterHub's, tied to the cookie and the session; asked only when a header was
    sent). Never from the query or the body: a link or a form can set those."""
    sent = headers.get("X-XSRFToken") or headers.get("X-CSRFToken") or ""
    if not sent:
        return False
    want = expected()
    want = want.encode() if isinstance(want, str) else want
    try:
        return bool(want) and hmac.compare_digest(sent.encode("ascii"), want)
    except UnicodeEncodeError:
        return False
