"""Hibernation's doors in the notebook server: the next cell wakes its kernel, the API, the loop.

* :class:`WakingConnection`, Jupyter Server's kernel websocket connection with one change: an
  ``execute_request`` for a hibernated kernel is held, the kernel woken, and then it and every
  message that came after it are sent on, in order. While the wake waits, the cell's output says
  why (a ``stderr`` stream message, as Jupyter Server's own warnings are shown).
* ``GET <base>gpushare/api/hibernation``: whether hibernation works here, the hub's
  ``hibernate_after``, and each kernel (:func:`~gpushare_hub.notebook.sleepstate.kernel_json`),
  named by the notebook its session runs (Jupyter Server's session manager).
* ``POST <base>gpushare/api/hibernation/<kernel id>`` with ``{"action": "hibernate" | "wake" |
  "keep-awake" | "allow-sleep"}``: the status bar's buttons.
* :func:`run_loop`: every few seconds, :meth:`Hibernator.tick` with the hub's ``hibernate_after``
  for this server (``api/v1/me``'s allocation), read through the extension's cached client.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.services.kernels.connection.base import deserialize_msg_from_ws_v1
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from tornado import web

from .hibernator import Hibernator
from .sleepstate import AWAKE, HIBERNATED, HIBERNATING, REFUSED, WAITING, WAKING, kernel_json, summary
from .status import pick_allocation

log = logging.getLogger("gpushare.hibernation")
HIBERNATOR_SETTING = "gpushare_hibernator"
ASLEEP = (HIBERNATING, HIBERNATED, WAITING, WAKING)
ACTIONS = ("hibernate", "wake", "keep-awake", "allow-sleep")
TICK_S = 2.0
MAX_BODY = 1024


def _header(conn: Any, incoming: Any) -> dict[str, Any] | None:
    """The message's header (JSON or the v1 binary protocol), or None when it cannot be read."""
    try:
        if conn.subprotocol == "v1.kernel.websocket.jupyter.org":
            channel, parts = deserialize_msg_from_ws_v1(incoming)  # type: ignore[no-untyped-call]
            header = json.loads(parts[0]) if channel == "shell" and parts else None
        else:
            msg = json.loads(incoming)
            header = msg.get("header") if msg.get("channel", "shell") == "shell" else None
    except (ValueError, TypeError, IndexError, AttributeError, UnicodeDecodeError):
        return None
    return header if isinstance(header, dict) else None


class WakingConnection(ZMQChannelsWebsocketConnection):
    """A kernel websocket whose cells wake their hibernated kernel before it runs them."""

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        held = getattr(self, "_held_back", None)
        if held is not None:  # a wake is under way: what follows waits behind the cell
            held.append(incoming_msg)
            return
        hib = self.websocket_handler.settings.get(HIBERNATOR_SETTING)
        if hib is not None and hib.sleep_of(self.kernel_id).state in ASLEEP:
            header = _header(self, incoming_msg)
            if header is not None and header.get("msg_type") == "execute_request":
                self._held_back: list[Any] | None = [incoming_msg]
                self._waking = asyncio.ensure_future(self._wake_then_send(hib, header))
                return
        super().handle_incoming_message(incoming_msg)

    async def _wake_then_send(self, hib: Hibernator, header: dict[str, Any]) -> None:
        told = ""
        waking = hib.wake_soon(self.kernel_id)
        try:
            while not waking.done():
                sleep = hib.sleep_of(self.kernel_id)
                if sleep.state == WAITING and sleep.why and sleep.why != told:
                    told = sleep.why
                    self.write_stderr(f"gpushare: {told}", header)  # type: ignore[no-untyped-call]
                await asyncio.wait([waking], timeout=0.5)
            waking.result()
        except Exception as err:  # the cell still runs: its CUDA calls wait for the wake
            log.warning("gpushare: waking kernel %s failed: %r", self.kernel_id, err)
        finally:
            held: list[Any] | None = self._held_back
            self._held_back = None
            for msg in held or []:
                super().handle_incoming_message(msg)


class HibernationHandler(APIHandler):
    """``gpushare/api/hibernation`` and ``gpushare/api/hibernation/<kernel id>``."""

    @property
    def hibernator(self) -> Hibernator | None:
        return self.settings.get(HIBERNATOR_SETTING)

    def _send(self, doc: dict[str, Any]) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(doc))

    @web.authenticated
    async def get(self, kernel_id: str = "") -> None:
        names = await notebook_paths(self.settings.get("session_manager"))
        self._send(document(self.hibernator, self.settings.get(AFTER_SETTING), names))

    @web.authenticated
    async def post(self, kernel_id: str = "") -> None:
        action = action_of(self.request.body)
        hib = self.hibernator
        if hib is None:
            raise web.HTTPError(409, "hibernation is off in this server: it has no GPU slice")
        if not kernel_id:
            raise web.HTTPError(404, "name a kernel: POST gpushare/api/hibernation/<kernel id>")
        if kernel_id not in set(hib.kernels.list_kernel_ids()):
            raise web.HTTPError(404, f"no kernel {kernel_id[:40]!r} in this server")
        sleep = hib.sleep_of(kernel_id)
        if action == "keep-awake":
            sleep.keep_awake = True
            if sleep.state in ASLEEP:
                hib.wake_soon(kernel_id)
        elif action == "allow-sleep":
            sleep.keep_awake = False
        elif action == "hibernate":
            if sleep.state not in (AWAKE, REFUSED):
                raise web.HTTPError(409, f"the kernel is {sleep.state}, not awake")
            sleep = await hib.hibernate(kernel_id)
            if sleep.state == AWAKE:
                raise web.HTTPError(409, "the kernel holds no GPU memory, or is busy: nothing to hibernate")
        else:
            hib.wake_soon(kernel_id)
        self._send(kernel_json(sleep, time.time()))


AFTER_SETTING = "gpushare_hibernate_after"
EXAMPLE = '{"action": "hibernate"}'


def action_of(body: bytes) -> str:
    """The body's ``action``, or a 400 that says what was wrong."""
    if len(body) > MAX_BODY:
        raise web.HTTPError(413, f"the body has {len(body)} bytes; send at most {MAX_BODY}, like {EXAMPLE}")
    try:
        doc = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise web.HTTPError(400, f"the body is not JSON; send an object like {EXAMPLE}") from None
    action = doc.get("action") if isinstance(doc, dict) else None
    if action not in ACTIONS:
        choices = ", ".join(ACTIONS)
        raise web.HTTPError(
            400,
            f'"action" must be one of {choices} in a JSON object like {EXAMPLE}, not {str(action)[:40]!r}',
        )
    return str(action)


async def notebook_paths(sessions: Any) -> dict[str, str]:
    """Each kernel's notebook (its session's path), by Jupyter Server's session manager; ``{}``
    without one or when it cannot list them."""
    if sessions is None:
        return {}
    try:
        listed = await sessions.list_sessions()
    except Exception as err:  # a name is a nicety: the kernels are listed without one
        log.debug("gpushare: no session names: %r", err)
        return {}
    names: dict[str, str] = {}
    for s in listed if isinstance(listed, list) else []:
        if not isinstance(s, dict) or not isinstance(s.get("kernel"), dict):
            continue
        kid, path = s["kernel"].get("id"), s.get("path") or s.get("name")
        if isinstance(kid, str) and isinstance(path, str):
            names[kid] = path
    return names


def document(
    hib: Hibernator | None, after: int | None, names: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``GET gpushare/api/hibernation``; ``names``: each kernel's notebook (:func:`notebook_paths`)."""
    now = time.time()
    if hib is None:
        why = "this server has no GPU slice"
        return {"available": False, "why_not": why, "hibernate_after": None, "summary": "", "kernels": []}
    kernels = [hib.sleep_of(k) for k in hib.kernels.list_kernel_ids()]
    return {
        "available": True,
        "why_not": "",
        "hibernate_after": after,
        "summary": summary(kernels),
        "kernels": [{**kernel_json(k, now), "name": (names or {}).get(k.kernel_id, k.name)} for k in kernels],
    }


def hibernate_after(doc: dict[str, Any] | None, env: dict[str, str] | Any) -> int | None:
    """This server's ``hibernate_after`` in the hub's ``api/v1/me`` (None: off)."""
    alloc = pick_allocation(doc, env.get("JUPYTERHUB_SERVER_NAME", ""))
    value = (alloc or {}).get("hibernate_after")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


async def run_loop(settings: dict[str, Any], hub: Any) -> None:
    """Apply the hub's hibernation rule to this server's kernels, for as long as it runs."""
    hib: Hibernator = settings[HIBERNATOR_SETTING]
    while True:
        try:
            doc, _problem = await hub.read(os.environ)
            after = hibernate_after(doc, os.environ)
            settings[AFTER_SETTING] = after
            await hib.tick(after)
        except Exception as err:  # never stop the loop: the next tick tries again
            log.warning("gpushare: hibernation tick failed: %r", err)
        await asyncio.sleep(TICK_S)


def install(serverapp: Any, base: str) -> list[tuple[str, type]]:
    """Set hibernation up in this server (where it holds a GPU slice): the hibernator, the waking
    websocket, the loop; the handlers to add."""
    from jupyter_server.utils import url_path_join
    from tornado.ioloop import IOLoop

    from gpushare_hub.isolation.checkpoint import driver_for

    settings = serverapp.web_app.settings
    hib = Hibernator(serverapp.kernel_manager, driver_for(os.environ), os.environ)
    settings[HIBERNATOR_SETTING] = hib
    current = settings.get("kernel_websocket_connection_class")
    if current in (None, ZMQChannelsWebsocketConnection):
        settings["kernel_websocket_connection_class"] = WakingConnection
    else:
        serverapp.log.warning(
            "gpushare: kernels are reached through %s, not Jupyter Server's own websocket: a cell "
            "sent to a hibernated kernel wakes it when the kernel turns busy (within seconds)",
            current,
        )
    IOLoop.current().add_callback(run_loop, settings, settings["gpushare_hub_me"])
    api = url_path_join(base, "gpushare", "api", "hibernation")
    return [(api, HibernationHandler), (api + "/([0-9a-zA-Z_-]{1,64})", HibernationHandler)]
