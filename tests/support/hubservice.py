"""The hub service's own tornado application (``GPUShareService.make_app``) on loopback, behind a
fake hub that names a caller per token: the service's HubOAuth asks it ``GET /hub/api/user`` as it
asks JupyterHub, so each test chooses the model and the token's own scopes JupyterHub would
return. No Kubernetes: the ledger is unknown (the watch never starts)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

ACCESS = "access:services!service=gpushare"


def user_model(name: str, scopes: list[str], *, admin: bool = False, kind: str = "user") -> dict[str, Any]:
    """What JupyterHub's ``/hub/api/user`` answers for a token: its owner's model (``admin`` is
    the owner's flag, whatever the token may do) and the token's own ``scopes``."""
    return {"kind": kind, "name": name, "admin": admin, "groups": [], "scopes": [ACCESS, *scopes]}


# The kinds of token JupyterHub hands out, as /hub/api/user describes them (scopes expanded).
def own_token(name: str, *, admin: bool = False) -> dict[str, Any]:
    """A user's own API token (JupyterHub's default: the owner's permissions)."""
    mine = [f"access:servers!user={name}", f"read:users!user={name}", f"servers!user={name}"]
    hub_admin = ["admin:users", "admin-ui", "access:servers", "admin:servers"] if admin else []
    return user_model(name, [*mine, *hub_admin], admin=admin)


def server_token(name: str, *, admin: bool = False, server: str = "") -> dict[str, Any]:
    """A notebook server's token (JupyterHub's ``server`` role, with the service's access)."""
    return user_model(
        name, [f"access:servers!server={name}/{server}", f"users:activity!user={name}"], admin=admin
    )


def service_token(name: str, scopes: list[str]) -> dict[str, Any]:
    return user_model(name, scopes, kind="service")


@dataclass
class ServiceUnderTest:
    """The service's port, the fake hub's callers by token, and the service object."""

    port: int
    callers: dict[str, dict[str, Any]]
    service: Any
    state_db: Path
    cookie_secret: bytes = b""
    log: list[str] = field(default_factory=list)

    def cookie(self, token: str) -> str:
        """The ``Cookie`` header of a browser that logged in to the service with ``token`` (the
        OAuth cookie HubOAuth sets after the hub's login, signed as the service signs it)."""
        from jupyterhub.services.auth import HubOAuth

        name = HubOAuth.instance().cookie_name
        signed = web.create_signed_value(self.cookie_secret, name, token).decode()
        return f"{name}={signed}; jupyterhub-session-id=session-1"

    def call(
        self, method: str, route: str, token: str | None = None, body: bytes | None = None, **headers: str
    ) -> tuple[int, Any]:
        """``method`` on ``/services/gpushare/<route>``; the status and the JSON (or text) answer."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        sent = dict(headers)
        if token is not None:
            sent["Authorization"] = f"token {token}"
        conn.request(method, f"/services/gpushare/{route}", body=body, headers=sent)
        resp = conn.getresponse()
        raw = resp.read()
        conn.close()
        try:
            return resp.status, json.loads(raw)
        except ValueError:
            return resp.status, raw.decode(errors="replace")


def _listening() -> tuple[list[socket.socket], int]:
    """A socket on a port the kernel chose, already bound: two ports asked for in turn and bound
    later may be the same one."""
    sockets = bind_sockets(0, "127.0.0.1")
    return sockets, int(sockets[0].getsockname()[1])


def _serve_in_thread(app: web.Application, sockets: list[socket.socket], **server: Any) -> Callable[[], None]:
    """Serve ``app`` on ``sockets`` in a loop of its own thread; the function that stops it."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        HTTPServer(app, **server).add_sockets(sockets)
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10), "the server did not start"

    def stop() -> None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)

    return stop


@pytest.fixture
def hub_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServiceUnderTest]:
    """The service (make_app, as ``run`` wires it) behind a fake hub; add callers to ``callers``."""
    from jupyterhub.services.auth import HubOAuth

    from gpushare_hub.core import DEFAULT_NAMES
    from gpushare_hub.service.app import GPUShareService
    from gpushare_hub.service.hubapi import HubAPI
    from gpushare_hub.service.sources import Cluster, HubServers
    from gpushare_hub.web.bodylimit import SERVER_MAX_BODY

    callers: dict[str, dict[str, Any]] = {}

    class UserHandler(web.RequestHandler):
        def get(self, name: str = "") -> None:
            if name:  # the service's own token reads a user's groups
                self.finish({"name": name, "groups": []})
                return
            token = self.request.headers.get("Authorization", "").partition(" ")[2]
            if token not in callers:
                raise web.HTTPError(404)
            self.finish(callers[token])

    (hub_sockets, hub_port), (sockets, port) = _listening(), _listening()
    api_url = f"http://127.0.0.1:{hub_port}/hub/api"
    monkeypatch.setenv("JUPYTERHUB_API_URL", api_url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-own-token")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_NAME", "gpushare")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/services/gpushare/")
    monkeypatch.setenv("JUPYTERHUB_CLIENT_ID", "service-gpushare")
    monkeypatch.setenv("JUPYTERHUB_OAUTH_ACCESS_SCOPES", json.dumps([ACCESS]))
    HubOAuth.clear_instance()
    svc = GPUShareService()
    svc.initialize([])
    db = tmp_path / "state" / "gpushare-service.sqlite"
    svc.state_db = str(db)
    svc.open_book(HubAPI(api_url, "service-own-token"))  # as run() wires it
    cluster = Cluster(lambda: None, DEFAULT_NAMES, 30.0)
    hub = HubServers(api_url, "service-own-token")
    fake_hub = web.Application([(r"/hub/api/user", UserHandler), (r"/hub/api/users/([^/]+)", UserHandler)])
    stop_hub = _serve_in_thread(fake_hub, hub_sockets)
    app = svc.make_app(cluster, hub)
    stop_service = _serve_in_thread(app, sockets, max_body_size=SERVER_MAX_BODY)
    try:
        yield ServiceUnderTest(port, callers, svc, db, app.settings["cookie_secret"])
    finally:
        with contextlib.suppress(Exception):
            stop_service()
            stop_hub()
        HubOAuth.clear_instance()
