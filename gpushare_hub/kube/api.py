"""Raw API calls (kubernetes_asyncio) with a timeout on every one of them.

Objects are handled as the API server's JSON (camelCase dicts), which is what
the core reads; nothing is converted to client model classes on the hot path.
kubernetes_asyncio checks a response's status only when it parses the body
itself, so :func:`checked` does it for raw responses.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

# The exception type callers catch for an answer of the API server that is not 2xx.
ApiError = ApiException


@dataclass(frozen=True)
class Timeouts:
    """Seconds. ``request``: one ordinary call, answer included. ``watch``: the server ends
    each watch after this (``timeoutSeconds``); the client gives up ``watch_grace`` later,
    so a frozen API server cannot hold a watch open for ever. ``connect``: reaching it."""

    request: float = 10.0
    watch: int = 60
    watch_grace: float = 15.0
    connect: float = 5.0

    def call(self, total: float | None = None) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=total or self.request, connect=self.connect, sock_connect=self.connect
        )

    def stream(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=self.watch + self.watch_grace, connect=self.connect, sock_connect=self.connect
        )


DEFAULT_TIMEOUTS = Timeouts()


async def make_api_client(kubeconfig: str | None, in_cluster: bool) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, or the pod's service account in-cluster."""
    if in_cluster:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    return await config.new_client_from_config(config_file=kubeconfig)


async def checked(call: Awaitable[Any]) -> Any:
    """Await a ``_preload_content=False`` call and raise ApiError on a non-2xx answer."""
    resp = await call
    if not 200 <= resp.status <= 299:
        body = await resp.read()
        resp.release()
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = body.decode(errors="replace")[:200]
        raise ApiError(status=resp.status, reason=message or resp.reason)
    return resp


async def json_of(call: Awaitable[Any]) -> Any:
    resp = await checked(call)
    try:
        return json.loads(await resp.read())
    finally:
        resp.release()


class Resource:
    """List and watch one kind (``nodes`` or ``pods``, all namespaces) as raw JSON."""

    def __init__(self, api: client.ApiClient, kind: str, timeouts: Timeouts = DEFAULT_TIMEOUTS) -> None:
        if kind not in ("nodes", "pods"):
            raise ValueError(f"kind must be nodes or pods, not {kind!r}")
        core = client.CoreV1Api(api)
        self.kind = kind
        self.timeouts = timeouts
        self._func = core.list_node if kind == "nodes" else core.list_pod_for_all_namespaces

    async def list(self) -> tuple[list[dict[str, Any]], str]:
        """Every object and the list's resourceVersion (where a watch resumes)."""
        body = await json_of(self._func(_preload_content=False, _request_timeout=self.timeouts.call(60.0)))
        return body["items"], body["metadata"]["resourceVersion"]

    async def watch(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) events from ``resource_version`` until the server ends the watch.

        Reads the newline-delimited JSON itself: one ``json.loads`` per event (the
        library's Watch decodes every event twice). An ERROR event raises ApiError
        (410 when the resource version is too old: the caller lists again).
        BOOKMARK events are passed on so that the caller keeps its resource version.
        """
        resp = await checked(
            self._func(
                watch=True,
                resource_version=resource_version,
                timeout_seconds=self.timeouts.watch,
                allow_watch_bookmarks=True,
                _preload_content=False,
                _request_timeout=self.timeouts.stream(),
            )
        )
        buf = b""
        try:
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    etype, obj = event.get("type"), event.get("object") or {}
                    if etype == "ERROR":
                        raise ApiError(status=obj.get("code"), reason=obj.get("message"))
                    yield str(etype), obj
        finally:
            resp.release()
