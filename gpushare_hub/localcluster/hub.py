"""A real JupyterHub and configurable-http-proxy beside the local cluster.

Usage::

    hub = LocalHub(cluster, namespace="hub", spawner={"scheduler_name": "gpushare-scheduler"})
    hub.start()                                 # proxy, then the hub (DummyAuthenticator)
    hub.api("POST", "/users/alice/server")      # the REST API as an admin service
    hub.proxy_get("/user/alice/api/status", token=hub.user_token("alice"))

The proxy is installed from npm at a pinned version into a cache outside the repository
(``~/.cache/gpushare-hub/npm``, reused when present). Ports are chosen free, the database is
a fresh sqlite file in the cluster's work folder (written without fsync: a hub process that
dies loses nothing, only the machine's own crash could; JupyterHub commits several times per
spawn, and each fsync stalls its one event loop), the hub reaches the API server with the
cluster's admin kubeconfig, and both processes are components of the cluster, so they stop
with it and their logs sit beside the others.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import timing
from .cluster import LocalCluster
from .processes import Component, HarnessError, free_port

PROXY_PACKAGE = "configurable-http-proxy"
PROXY_VERSION = "5.3.0"


def npm_cache_root() -> Path:
    """$GPUSHARE_NPM_CACHE, else ~/.cache/gpushare-hub/npm (beside the Kubernetes binaries)."""
    env = os.environ.get("GPUSHARE_NPM_CACHE")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "gpushare-hub" / "npm"


def proxy_command(log: Any = None) -> Path:
    """configurable-http-proxy at :data:`PROXY_VERSION`, installed with npm on first use."""
    root = npm_cache_root() / f"{PROXY_PACKAGE}-{PROXY_VERSION}"
    exe = root / "node_modules" / ".bin" / PROXY_PACKAGE
    with timing.timed(f"npm: {PROXY_PACKAGE} {PROXY_VERSION}") as step:
        if not exe.exists():
            step.cold = True
            _npm_install(root, exe, log)
    return exe


def _npm_install(root: Path, exe: Path, log: Any) -> None:
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise HarnessError(
            "configurable-http-proxy needs Node.js and npm (>= 18): install them, e.g. "
            "`apt-get install nodejs npm`, then run again"
        )
    partial = root.with_name(root.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    cmd = [
        npm,
        "install",
        "--prefix",
        str(partial),
        "--no-audit",
        "--no-fund",
        "--omit=dev",
        f"{PROXY_PACKAGE}@{PROXY_VERSION}",
    ]
    print(f"[localcluster] $ {' '.join(cmd)}", file=log or sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise HarnessError(f"npm could not install {PROXY_PACKAGE}@{PROXY_VERSION}:\n{done.stderr[-2000:]}")
    try:
        partial.rename(root)
    except OSError:  # another run installed it meanwhile
        shutil.rmtree(partial, ignore_errors=True)
    if not exe.exists():
        raise HarnessError(f"npm installed {PROXY_PACKAGE} but {exe} is missing")


# The hub's sqlite connections skip fsync (PRAGMA synchronous=OFF): see the module's docstring.
NO_FSYNC = (
    "import sqlalchemy.engine, sqlalchemy.event",
    "@sqlalchemy.event.listens_for(sqlalchemy.engine.Engine, 'connect')",
    "def _no_fsync(connection, _record):",
    "    if type(connection).__module__.startswith('sqlite3'):",
    "        connection.execute('PRAGMA synchronous=OFF')",
)


def _py(value: Any) -> str:
    return repr(value)


class LocalHub:
    """JupyterHub with KubeSpawner against ``cluster``; one per test session is plenty."""

    def __init__(
        self,
        cluster: LocalCluster,
        namespace: str,
        spawner: Mapping[str, Any] | None = None,
        spawner_class: str = "kubespawner.KubeSpawner",
        extra_config: str = "",
        name: str = "hub",
        port: int | None = None,
    ) -> None:
        """``name`` tells hubs of one cluster apart (work folder, component and log names);
        ``port``: the proxy's public port (the hub's address), else one chosen free."""
        self.cluster = cluster
        self.name = name
        self._suffix = "" if name == "hub" else f"-{name}"
        self.namespace = namespace
        self.spawner = dict(spawner or {})
        self.spawner_class = spawner_class
        self.extra_config = extra_config
        self.port = port
        self.workdir = cluster.workdir / name
        self.token = secrets.token_hex(32)
        self.proxy_token = secrets.token_hex(32)
        self.url = ""
        self.direct_url = ""
        self.hub: Component | None = None
        self.proxy: Component | None = None
        self._user_tokens: dict[str, str] = {}

    def config_text(self, hub_port: int, proxy_api: str) -> str:
        short = self.spawner_class.rsplit(".", 1)[-1]
        lines = [
            "c = get_config()  # noqa",
            f"c.JupyterHub.bind_url = {_py(self.url)}",
            "c.JupyterHub.hub_ip = '127.0.0.1'",
            f"c.JupyterHub.hub_port = {hub_port}",
            f"c.JupyterHub.hub_connect_url = {_py(f'http://127.0.0.1:{hub_port}')}",
            f"c.JupyterHub.db_url = {_py('sqlite:///' + str(self.workdir / 'jupyterhub.sqlite'))}",
            f"c.JupyterHub.cookie_secret_file = {_py(str(self.workdir / 'cookie_secret'))}",
            f"c.JupyterHub.pid_file = {_py(str(self.workdir / 'jupyterhub.pid'))}",
            "c.JupyterHub.authenticator_class = 'dummy'",
            f"c.JupyterHub.spawner_class = {_py(self.spawner_class)}",
            "c.JupyterHub.cleanup_servers = True",
            "c.JupyterHub.log_level = 'DEBUG'",
            *NO_FSYNC,
            "c.ConfigurableHTTPProxy.should_start = False",
            f"c.ConfigurableHTTPProxy.api_url = {_py(proxy_api)}",
            f"c.ConfigurableHTTPProxy.auth_token = {_py(self.proxy_token)}",
            f"c.JupyterHub.services = [{{'name': 'harness', 'api_token': {_py(self.token)}}}]",
            "c.JupyterHub.load_roles = [{'name': 'admin', 'services': ['harness']}]",
            f"c.{short}.namespace = {_py(self.namespace)}",
        ]
        lines += [f"c.{short}.{key} = {_py(value)}" for key, value in self.spawner.items()]
        return "\n".join(lines) + "\n" + self.extra_config + "\n"

    def start(self) -> LocalHub:
        self.workdir.mkdir(parents=True, exist_ok=True)
        chp = proxy_command()
        public, api, hub_port = self.port or free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{public}"
        self.direct_url = f"http://127.0.0.1:{hub_port}"  # JupyterHub itself, not through the proxy
        proxy_api = f"http://127.0.0.1:{api}"
        env = {**os.environ, "CONFIGPROXY_AUTH_TOKEN": self.proxy_token}
        self.proxy = Component(
            f"configurable-http-proxy{self._suffix}",
            [
                str(chp),
                "--ip=127.0.0.1",
                f"--port={public}",
                "--api-ip=127.0.0.1",
                f"--api-port={api}",
                f"--error-target=http://127.0.0.1:{hub_port}/hub/error",
                "--log-level=info",
            ],
            self.cluster.logs / f"configurable-http-proxy{self._suffix}.log",
            env=env,
        ).start()
        self.cluster.components[self.proxy.name] = self.proxy
        self.proxy.wait_until(
            lambda: self._status(f"{proxy_api}/api/routes", self.proxy_token) == 200, 60, "serving its API"
        )
        config = self.workdir / "jupyterhub_config.py"
        config.write_text(self.config_text(hub_port, proxy_api))
        self.hub = Component(
            f"jupyterhub{self._suffix}",
            [sys.executable, "-m", "jupyterhub", "-f", str(config)],
            self.cluster.logs / f"jupyterhub{self._suffix}.log",
            env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)},
        ).start()
        self.cluster.components[self.hub.name] = self.hub
        self.hub.wait_until(lambda: self.api("GET", "/")[0] == 200, 120, "answering /hub/api")
        return self

    # ---- HTTP --------------------------------------------------------------------------------
    @staticmethod
    def _status(url: str, token: str) -> int:
        req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status)

    def request(
        self, method: str, url: str, token: str, body: Any = None, timeout: float = 30
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            url,
            data=data,
            method=method,
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = int(resp.status), resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        """The hub's REST API (``/hub/api`` + ``path``), as the admin service unless ``token``."""
        return self.request(method, f"{self.url}/hub/api{path}", token or self.token, body)

    def proxy_get(self, path: str, token: str, timeout: float = 30) -> tuple[int, Any]:
        """GET through the proxy, as a browser or a client of a notebook would."""
        return self.request("GET", self.url + path, token, timeout=timeout)

    def user_token(self, user: str) -> str:
        """A token of ``user`` (created with the user when needed)."""
        if user not in self._user_tokens:
            status, _ = self.api("POST", f"/users/{user}")
            if status not in (201, 409):
                raise HarnessError(f"cannot create hub user {user}: HTTP {status}")
            status, body = self.api("POST", f"/users/{user}/tokens", {"note": "harness", "expires_in": 7200})
            if status != 201:
                raise HarnessError(f"cannot create a token for {user}: HTTP {status} {body}")
            self._user_tokens[user] = body["token"]
        return self._user_tokens[user]

    def wait_ready(self, user: str, timeout: float = 240) -> dict[str, Any]:
        """Wait until the user's default server is ready; its model, or HarnessError with why not."""
        deadline = time.monotonic() + timeout
        model: Any = None
        while time.monotonic() < deadline:
            status, model = self.api("GET", f"/users/{user}")
            server = (model or {}).get("servers", {}).get("") if status == 200 else None
            if server and server.get("ready"):
                return dict(server)
            if status == 200 and not server and not model.get("pending"):
                raise HarnessError(f"{user}'s server stopped before it was ready; hub log {self.hub_log}")
            time.sleep(0.25)
        raise HarnessError(f"{user}'s server not ready after {timeout:.0f}s: {model}; hub log {self.hub_log}")

    def stop(self) -> None:
        """Stop the hub (its managed services with it), then its proxy: a hub one test starts
        for itself. The cluster stops every other component at its end."""
        for comp in (self.hub, self.proxy):
            if comp is not None:
                comp.stop()
                self.cluster.components.pop(comp.name, None)

    @property
    def hub_log(self) -> Path:
        return self.cluster.logs / f"jupyterhub{self._suffix}.log"
