"""A Jupyter server extension: ``/user/<name>/gpushare`` shows what this server got.

The card's UUID, the slice, and the caps in force, read from the server's own environment (see
``sliceinfo.py``); ``.../gpushare/api`` gives the same as JSON; ``.../gpushare/api/status`` adds
the hub service's view (what the slice uses, the isolation tier, the neighbours on the card: see
``status.py``) for the JupyterLab status bar; ``POST .../gpushare/api/selftest`` runs
``gpushare-selftest --json`` in this server (the panel's button). Loaded where it is enabled
(``jupyter_server_config.d``, see ``install.py``; the demo also names it on the command line).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from typing import Any

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from .hubclient import HubMe
from .overslice import server_processes
from .sliceinfo import SliceInfo, as_json, read_slice, render_html
from .status import returned_slice, status_document

PATH = "gpushare"
HUB_SETTING = "gpushare_hub_me"  # the web app's setting that holds this process's HubMe


def hook_loaded() -> bool:
    """Whether this process imported gpushare's start-up hook (``sitecustomize`` with its names)."""
    module = sys.modules.get("sitecustomize")
    return getattr(module, "LIMIT_VAR", None) == "GPUSHARE_MEMORY_LIMIT_MIB"


def current() -> SliceInfo:
    return read_slice(os.environ, hook_loaded=hook_loaded())


class SliceHandler(JupyterHandler):
    @web.authenticated
    def get(self) -> None:
        lab = url_path_join(self.base_url, "lab")
        api = url_path_join(self.base_url, PATH, "api")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(render_html(current(), lab, api))


class SliceApiHandler(JupyterHandler):
    @web.authenticated
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(as_json(current())))


class StatusApiHandler(JupyterHandler):
    """The status bar's JSON: the local slice, the hub service's document, words for a problem."""

    @web.authenticated
    async def get(self) -> None:
        info = current()
        hub: dict[str, Any] | None = None
        problem = ""
        if info.has_gpu:
            hub, problem = await self.settings[HUB_SETTING].read(os.environ)
        server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        doc = status_document(
            info, hub, problem, server, returned_slice(os.environ), server_processes(os.environ)
        )
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(doc))


class SelfTestHandler(JupyterHandler):
    """``POST .../gpushare/api/selftest``: run ``gpushare-selftest --json`` here (the panel's
    button), one at a time per server, and answer its document."""

    running = False

    @web.authenticated
    async def post(self) -> None:
        cls = type(self)
        if cls.running:
            raise web.HTTPError(409, "a self-test is already running in this server; wait for it")
        if not current().has_gpu:
            raise web.HTTPError(409, "this server holds no GPU slice: there is nothing to test")
        cls.running = True
        try:
            doc = await run_selftest()
        finally:
            cls.running = False
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(doc))


class KeepHandler(JupyterHandler):
    """``POST .../gpushare/api/keep``: the panel's Keep button. Asks the hub service, with this
    server's own token, to put off returning this server's idle slice (``api/v1/me/keep``), and
    answers what the service said (its status and words)."""

    @web.authenticated
    async def post(self) -> None:
        from .hubclient import keep

        status, doc = await keep(os.environ, os.environ.get("JUPYTERHUB_SERVER_NAME", ""))
        self.settings[HUB_SETTING].forget()  # the next status shows the Keep
        self.set_status(status if 200 <= status < 600 else 502)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(doc))


SELFTEST_TIMEOUT = 600.0


async def run_selftest(timeout: float = SELFTEST_TIMEOUT) -> dict[str, Any]:
    """The self-test's JSON, or ``{"error": ...}`` in words; its processes go on timeout."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpushare_hub.isolation.selftest",
        "--json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        return {"error": f"the self-test took longer than {timeout:.0f} s and was stopped"}
    try:
        doc = json.loads(out)
    except ValueError:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"error": f"the self-test failed (exit {proc.returncode}): {tail[0][:300]}"}
    return doc if isinstance(doc, dict) else {"error": "the self-test's answer is not a JSON object"}


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpushare_hub.notebook.slicepage"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.settings[HUB_SETTING] = HubMe()
    hibernation: list[tuple[str, type]] = []
    if current().has_gpu:
        from .wakeonrun import install

        hibernation = install(serverapp, base)
    serverapp.web_app.add_handlers(
        ".*$",
        [
            *hibernation,
            (url_path_join(base, PATH), SliceHandler),
            (url_path_join(base, PATH, "api"), SliceApiHandler),
            (url_path_join(base, PATH, "api", "status"), StatusApiHandler),
            (url_path_join(base, PATH, "api", "selftest"), SelfTestHandler),
            (url_path_join(base, PATH, "api", "keep"), KeepHandler),
        ],
    )
    serverapp.log.info("gpushare: %s at %s", current().summary(), url_path_join(base, PATH))
