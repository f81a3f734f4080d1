"""A Jupyter server extension: ``/user/<name>/gpushare`` shows what this server got.

The demo's notebook servers load it (``--ServerApp.jpserver_extensions``) and open on it
(``default_url``): the card's UUID, the slice, and the caps in force, read from the server's
own environment (see ``sliceinfo.py``); ``.../gpushare/api`` gives the same as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from .sliceinfo import SliceInfo, as_json, read_slice, render_html

PATH = "gpushare"


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


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "gpushare_hub.demo.slicepage"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    base = serverapp.web_app.settings["base_url"]
    serverapp.web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, PATH), SliceHandler),
            (url_path_join(base, PATH, "api"), SliceApiHandler),
        ],
    )
    serverapp.log.info("gpushare: %s at %s", current().summary(), url_path_join(base, PATH))
