"""Hub tier: a real JupyterHub and configurable-http-proxy with a plain KubeSpawner, our scheduler
and extender, and local notebook nodes whose node agent runs each notebook as a process on its
pod IP after asking our device plugin to Allocate (fixtures for the cluster in tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare_hub.localcluster.cluster import LocalCluster
from gpushare_hub.localcluster.hub import LocalHub
from gpushare_hub.localcluster.nodeagent import Record, recorded_processes
from gpushare_hub.localcluster.notebooknodes import NotebookNodes, spawner_config
from tests.conftest import wait_for

NAMESPACE = "hub"
SCHEDULER = "gpushare-scheduler"

# One hub and one set of notebook nodes per session, even where another tier's conftest imports
# these fixtures (tests/browser): pytest would otherwise make a second instance for that folder.
_SESSION: dict[str, Any] = {}


@pytest.fixture(scope="session")
def notebook_nodes(local_cluster: LocalCluster, gpushare: Any) -> NotebookNodes:
    """Two local notebook nodes (nb-1, nb-2), one 15 GiB Tesla T4 each, served by the node agent."""
    if "nodes" in _SESSION:
        return _SESSION["nodes"]  # type: ignore[no-any-return]
    nodes = _SESSION["nodes"] = NotebookNodes(local_cluster)
    nodes.add(2, cards=1)
    nodes.start()
    return nodes


def hub_spawner_config() -> dict[str, Any]:
    """A plain KubeSpawner asking 5 GiB by default, 10 GiB with ``slice-10``; ``broken`` exits at once."""
    return {
        **spawner_config(slice_gib=5, scheduler=SCHEDULER),
        "profile_list": [
            {"display_name": "Tesla T4 · 5 GiB slice", "slug": "slice-5", "default": True},
            {
                "display_name": "Tesla T4 · 10 GiB slice",
                "slug": "slice-10",
                "kubespawner_override": {"extra_resource_limits": {"aliyun.com/gpu-mem": "10"}},
            },
            {
                "display_name": "A notebook command that fails at once",
                "slug": "broken",
                "kubespawner_override": {
                    "cmd": [
                        "python",
                        "-c",
                        "import sys; print('cannot read /etc/notebook.conf'); sys.exit(3)",
                    ],
                    "http_timeout": 30,  # the hub gives up on it soon
                },
            },
        ],
    }


# GPUShareSpawner's catalogue in the session's hub (the plain profiles above stay KubeSpawner's).
SLICES = [
    {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]},
    {"slug": "t4-7g", "display_name": "Tesla T4 · 7 GiB", "gib": 7, "models": ["Tesla-T4"]},
    {"slug": "any-16g", "display_name": "16 GiB of any card", "gib": 16},
]
QUOTA_GIB = 10

# The gpushare hub service (gpushare_hub.service.configure_hub) in the session's hub: SERVICE_ADMIN
# holds custom:gpushare:admin; the service "scraper" (token SCRAPER_TOKEN) may read only metrics.
SERVICE = "gpushare"
SERVICE_ADMIN = "gpu-admin"
SCRAPER_TOKEN = secrets.token_hex(32)
GPU_IDLE_AFTER = 20  # seconds
# GiB·h budgets: members of BUDGET_GROUP have none until an admin adds some (0 GiB·h a week);
# once spent, their GPU servers are stopped BUDGET_GRACE seconds after the warning.
BUDGET_GROUP = "gpu-budget"
BUDGET_USERS = ("budget-bob", "budget-cy")
BUDGET_GRACE = 5


def service_config() -> str:
    """The lines that add the service to the hub's config (after the spawner's)."""
    return "\n".join(
        [
            "from gpushare_hub.service import configure_hub",
            f"scraper = {{'name': 'scraper', 'api_token': {SCRAPER_TOKEN!r}}}",
            "c.JupyterHub.services = [*c.JupyterHub.services, scraper]",
            # The service's own settings pass through configure_hub; a slice with no GPU work
            # for 20 s is flagged idle (the dashboard test waits for that).
            f"c.GPUShareService.gpu_idle_after = {GPU_IDLE_AFTER}",
            # Estimates of a waiting spawn's wait from any history at all (600 s by default).
            "c.GPUShareService.queue_estimate_after = 0",
            # The idle rule and the GiB·h book look every 5 s (30 s by default).
            "c.GPUShareService.gpu_idle_check_seconds = 5",
            f"c.GPUShareService.budget_grace_seconds = {BUDGET_GRACE}",
            f"c.JupyterHub.load_groups = {{{BUDGET_GROUP!r}: {{'users': {list(BUDGET_USERS)!r}}}}}",
            f"configure_hub(c, name={SERVICE!r}, admin_users=[{SERVICE_ADMIN!r}], "
            "metrics_services=['scraper'])",
        ]
    )


@pytest.fixture(scope="session")
def hub(local_cluster: LocalCluster, gpushare: Any, notebook_nodes: NotebookNodes) -> Iterator[LocalHub]:
    """The hub runs GPUShareSpawner: its catalogue beside the plain KubeSpawner profiles."""
    if "hub" in _SESSION:
        yield _SESSION["hub"]
        return
    local_cluster.create_namespace(NAMESPACE)
    config = {
        **hub_spawner_config(),
        "slices": SLICES,
        "quota_gib_per_user": QUOTA_GIB,
        "quota_gib_hours_per_group": {BUDGET_GROUP: 0.0},
        "gpushare_scheduler_name": SCHEDULER,
        "queue_estimate_after": 0,
    }
    h = LocalHub(
        local_cluster,
        NAMESPACE,
        config,
        spawner_class="gpushare_hub.GPUShareSpawner",
        extra_config="c.JupyterHub.allow_named_servers = True\n" + service_config(),
    ).start()
    _SESSION["hub"] = h
    yield h


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
    """One kernel of the user's server, kept across cells (what the notebook's tab holds)."""

    def __init__(self, hub: LocalHub, user: str, token: str) -> None:
        self.hub, self.user, self.token = hub, user, token
        self.kernel_id = ""
        self.conn: Any = None

    async def __aenter__(self) -> Kernel:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        base = f"{self.hub.url}/user/{self.user}/api/kernels"
        status, kernel = self.hub.request("POST", base, self.token, {"name": "python3"})
        assert status == 201, (status, kernel)
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
        self.hub.request(
            "DELETE", f"{self.hub.url}/user/{self.user}/api/kernels/{self.kernel_id}", self.token
        )

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
