"""Raw API calls (kubernetes_asyncio) with a timeout on every one of them.

Objects are handled as the API server's JSON (camelCase dicts), which is what
the core reads; nothing is converted to client model classes on the hot path.
kubernetes_asyncio checks a response's status only when it parses the body
itself, so :func:`checked` does it for raw responses.

Lists are read in pages (``limit``/``continue``, :func:`paged`), so that a relist of a large
cluster never holds every object at once, only one page while it is applied.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

# The exception type callers catch for an answer of the API server that is not 2xx.
ApiError = ApiException

PAGE = 500  # objects per list answer, as kubectl and client-go's reflector ask
EXPIRED_RESTARTS = 2  # paged restarts after an expired continue token; then one whole list
# The first event of every watch: the API server answered it (200), so the watch is healthy even
# where nothing changes for a while. Not the API server's: no object comes with it.
OPENED = "OPENED"


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
    """List and watch one kind (``nodes``, ``pods`` or ``resourceclaims``, all namespaces) as raw JSON."""

    def __init__(self, api: client.ApiClient, kind: str, timeouts: Timeouts = DEFAULT_TIMEOUTS) -> None:
        if kind not in ("nodes", "pods", "resourceclaims"):
            raise ValueError(f"kind must be nodes, pods or resourceclaims, not {kind!r}")
        self.kind = kind
        self.timeouts = timeouts
        if kind == "resourceclaims":  # resource.k8s.io/v1 (clients from 34.1 model it)
            resource = getattr(client, "ResourceV1Api", None)
            if resource is None:
                raise ValueError("this kubernetes_asyncio has no resource.k8s.io/v1 client (ResourceV1Api)")
            self._func = resource(api).list_resource_claim_for_all_namespaces
            return
        core = client.CoreV1Api(api)
        self._func = core.list_node if kind == "nodes" else core.list_pod_for_all_namespaces

    async def list_page(self, limit: int = PAGE, cont: str = "") -> ListPage:
        """One answer of a list: up to ``limit`` objects (0: all) from ``cont`` (a continue
        token; empty: the first page), the list's resourceVersion and the next token ("" at the
        end)."""
        params: dict[str, Any] = {}
        if limit > 0:
            params["limit"] = limit
        if cont:
            params["_continue"] = cont
        body = await json_of(
            self._func(**params, _preload_content=False, _request_timeout=self.timeouts.call(60.0))
        )
        meta = body.get("metadata") or {}
        rv, cont = str(meta.get("resourceVersion") or ""), str(meta.get("continue") or "")
        return body.get("items") or [], rv, cont

    async def watch(self, resource_version: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """(type, object) events from ``resource_version`` until the server ends the watch.

        Reads the newline-delimited JSON itself: one ``json.loads`` per event (the
        library's Watch decodes every event twice). An ERROR event raises ApiError
        (410 when the resource version is too old: the caller lists again).
        BOOKMARK events are passed on so that the caller keeps its resource version. The first
        event is ``(OPENED, {})`` once the server has answered: a watch that resumed where nothing
        changes since sends nothing else until a bookmark, up to a minute later.
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
            yield OPENED, {}
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


# ---- lists in pages ----------------------------------------------------------------------------

# (objects, the list's resourceVersion, the continue token of the next page or "")
ListPage = tuple[list[dict[str, Any]], str, str]
ListFunc = Callable[[int, str], Awaitable[ListPage]]


@dataclass(frozen=True)
class Page:
    """One page of a list. ``restart``: the list began again from its first page (the previous
    pages' continue token expired), so what the pages before said is void. The last page's
    ``resource_version`` is where a watch of the same kind resumes."""

    items: list[dict[str, Any]]
    resource_version: str
    restart: bool = False


async def paged(
    list_page: ListFunc, limit: int = PAGE, restarts: int = EXPIRED_RESTARTS
) -> AsyncIterator[Page]:
    """Every page of one list, as client-go's pager reads it.

    A continue token lives a few minutes on the server (until etcd compacts the revision the
    list started from); past that the next page is answered 410 Gone. The list then starts again
    from its first page, at most ``restarts`` times, and after that reads everything in one
    answer (client-go's fallback), so a list always ends. A 410 on a first page is raised.
    """
    cont, restart, expired = "", False, 0
    while True:
        whole = expired > restarts
        try:
            items, rv, cont = await list_page(0 if whole else limit, cont)
        except ApiError as err:
            if err.status != 410 or not cont:
                raise
            expired += 1
            cont, restart = "", True
            continue
        yield Page(items, rv, restart)
        del items
        restart = False
        if whole or not cont:
            return
