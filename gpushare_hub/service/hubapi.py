"""The service's one client of the hub's REST API, with the service's own token: a user's
model (their groups and servers), and stopping and starting servers (idle return, budgets)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode

from tornado import httpclient

# JupyterHub's paginated answer (items and _pagination), asked for by its media type.
PAGINATED = "application/jupyterhub-pagination+json"


class HubAPI:
    """The hub REST calls the service makes, with its token."""

    def __init__(self, api_url: str, token: str) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token

    def _server_path(self, user: str, server: str) -> str:
        u = quote(user, safe="")
        return f"/users/{u}/servers/{quote(server, safe='')}" if server else f"/users/{u}/server"

    async def call(
        self, method: str, path: str, body: Any = None, accept: str = "", timeout: float = 30
    ) -> tuple[int, Any]:
        """``method`` on ``path`` (below the API's URL); the status and the parsed JSON body
        (None when there is none or it is not JSON)."""
        http = httpclient.AsyncHTTPClient()
        headers = {"Authorization": f"token {self.token}", "Content-Type": "application/json"}
        if accept:
            headers["Accept"] = accept
        resp = await http.fetch(
            self.api_url + path,
            method=method,
            headers=headers,
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            raise_error=False,
            request_timeout=timeout,
        )
        try:
            parsed = json.loads(resp.body) if resp.body else None
        except ValueError:
            parsed = None
        return resp.code, parsed

    async def active_users(self) -> list[Any]:
        """Every user with an active server (``GET /users?state=active``, read page by page);
        :class:`OSError` when the hub does not answer with them."""
        users: list[Any] = []
        offset = 0
        while True:
            query = urlencode({"state": "active", "offset": offset, "limit": 200})
            status, body = await self.call("GET", f"/users?{query}", accept=PAGINATED, timeout=10)
            if status != 200 or not isinstance(body, dict | list):
                raise OSError(f"GET /users answered HTTP {status}")
            items = body.get("items", []) if isinstance(body, dict) else body
            users += items if isinstance(items, list) else []
            nxt = (body.get("_pagination") or {}).get("next") if isinstance(body, dict) else None
            if not nxt or not items:
                return users
            offset = int(nxt.get("offset", offset + len(items)))

    async def stop(self, user: str, server: str) -> tuple[int, Any]:
        return await self.call("DELETE", self._server_path(user, server))

    async def start(self, user: str, server: str, options: Mapping[str, Any]) -> tuple[int, Any]:
        return await self.call("POST", self._server_path(user, server), dict(options))

    async def user(self, user: str) -> tuple[int, Any]:
        """The hub's model of ``user`` (name, groups, servers)."""
        return await self.call("GET", f"/users/{quote(user, safe='')}")

    async def running(self, user: str, server: str) -> bool | None:
        """Whether the server is running or stopping (None: the hub could not be asked)."""
        status, model = await self.user(user)
        if status != 200 or not isinstance(model, dict):
            return None
        servers = model.get("servers")
        return isinstance(servers, dict) and server in servers
