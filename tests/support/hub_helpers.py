"""What the hub tier's tests and the browser tier's share about the session's hub: its settings
(from :mod:`tests.support.hub_session`, whose fixtures make the one hub of a session), and the
helpers that start and stop servers, find a user's pod and run code in a kernel."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from gpushare_hub.localcluster.cluster import LocalCluster
from gpushare_hub.localcluster.hub import LocalHub
from gpushare_hub.localcluster.nodeagent import Record, recorded_processes
from gpushare_hub.localcluster.notebooknodes import NotebookNodes
from tests.conftest import wait_for

# The session hub's settings (its fixtures are not imported here: they are registered once, in
# tests/conftest.py, so that a session has one hub).
from tests.support.hub_session import (  # noqa: F401
    BUDGET_GRACE,
    BUDGET_GROUP,
    BUDGET_USERS,
    GPU_IDLE_AFTER,
    NAMESPACE,
    QUOTA_GIB,
    SCHEDULER,
    SCRAPER_TOKEN,
    SERVICE,
    SERVICE_ADMIN,
    SLICES,
    hub_spawner_config,
    service_config,
)


def pod_of(cluster: LocalCluster, user: str) -> dict[str, Any] | None:
    import urllib.error

    try:
        return cluster.get_json(f"/api/v1/namespaces/{NAMESPACE}/pods/jupyter-{user}")  # type: ignore[no-any-return]
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return None
        raise


def record_of(nodes: NotebookNodes, uid: str) -> Record | None:
    return next((r for r in recorded_processes(nodes.state_dir) if r.uid == uid), None)


def start_server(hub: LocalHub, user: str, profile: str = "slice-5") -> tuple[str, dict[str, Any]]:
    token = hub.user_token(user)
    status, body = hub.api("POST", f"/users/{user}/server", {"profile": profile})
    assert status in (201, 202), (status, body)
    hub.wait_ready(user)
    return token, hub.api("GET", f"/users/{user}")[1]


def stop_server(hub: LocalHub, cluster: LocalCluster, user: str) -> None:
    status, body = hub.api("DELETE", f"/users/{user}/server")
    assert status in (202, 204), (status, body)
    assert wait_for(lambda: not hub.api("GET", f"/users/{user}")[1]["servers"], timeout=120)
    assert wait_for(lambda: pod_of(cluster, user) is None, timeout=120), "the pod was not deleted"


class Kernel:
    """One kernel of the user's server, kept across cells (what the notebook's tab holds).
    ``notebook``: started for that notebook's path, as JupyterLab opens one (a session: Jupyter
    Server gives the kernel ``JPY_SESSION_NAME``)."""

    def __init__(self, hub: LocalHub, user: str, token: str, notebook: str | None = None) -> None:
        self.hub, self.user, self.token = hub, user, token
        self.notebook = notebook
        self.kernel_id = ""
        self.session_id = ""
        self.conn: Any = None

    async def __aenter__(self) -> Kernel:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        api = f"{self.hub.url}/user/{self.user}/api"
        if self.notebook is None:
            status, kernel = self.hub.request("POST", f"{api}/kernels", self.token, {"name": "python3"})
            assert status == 201, (status, kernel)
        else:
            body = {
                "path": self.notebook,
                "name": self.notebook,
                "type": "notebook",
                "kernel": {"name": "python3"},
            }
            status, session = self.hub.request("POST", f"{api}/sessions", self.token, body)
            assert status == 201, (status, session)
            self.session_id, kernel = session["id"], session["kernel"]
        self.kernel_id = kernel["id"]
        ws_url = (
            self.hub.url.replace("http://", "ws://")
            + f"/user/{self.user}/api/kernels/{self.kernel_id}/channels"
        )
        self.conn = await websocket_connect(
            HTTPRequest(ws_url, headers={"Authorization": f"token {self.token}"})
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.conn.close()
        api = f"{self.hub.url}/user/{self.user}/api"
        if self.session_id:
            self.hub.request("DELETE", f"{api}/sessions/{self.session_id}", self.token)
        else:
            self.hub.request("DELETE", f"{api}/kernels/{self.kernel_id}", self.token)

    async def run(self, code: str, timeout: float = 180) -> tuple[str, dict[str, Any] | None]:
        """Execute ``code``; its stdout and stderr, and the error it raised (ename, evalue, traceback)."""
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": "execute_request", "username": self.user, "version": "5.3"}
        self.conn.write_message(
            json.dumps(
                {
                    "header": {**header, "session": uuid.uuid4().hex},
                    "parent_header": {},
                    "metadata": {},
                    "content": {"code": code, "silent": False, "store_history": False, "allow_stdin": False},
                    "channel": "shell",
                    "buffers": [],
                }
            )
        )
        out: list[str] = []
        error: dict[str, Any] | None = None
        while True:
            raw = await asyncio.wait_for(self.conn.read_message(), timeout=timeout)
            assert raw is not None, "the kernel's websocket closed"
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                error = msg["content"]
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out), error


async def _run_code(hub: LocalHub, user: str, token: str, code: str) -> str:
    async with Kernel(hub, user, token) as kernel:
        out, error = await kernel.run(code, timeout=120)
    if error is not None:
        raise AssertionError("\n".join(error["traceback"]))
    return out


def run_in_kernel(hub: LocalHub, user: str, token: str, code: str) -> str:
    """Run ``code`` in a new kernel of the user's notebook server (through the proxy); its stdout."""
    return asyncio.run(_run_code(hub, user, token, code))


def spawn_form(hub: LocalHub, user: str) -> str:
    """The spawn page as ``user`` sees it: logged in through the login form (the hub serves its
    HTML pages to a cookie, not to an API token)."""
    import requests

    with requests.Session() as s:
        s.get(f"{hub.url}/hub/login", timeout=30).raise_for_status()
        r = s.post(
            f"{hub.url}/hub/login",
            data={"username": user, "password": "any", "_xsrf": s.cookies.get("_xsrf", "")},
            timeout=30,
        )
        assert r.status_code == 200, (r.status_code, r.text[:500])
        r = s.get(f"{hub.url}/hub/spawn/{user}", timeout=60)
    page = r.content.decode("utf-8")
    assert r.status_code == 200 and "<form" in page, (r.status_code, page[:500])
    return page
