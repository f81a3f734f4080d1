"""A watch says it is open as soon as the API server answers, before any event.

After an API server restart, a watch that resumes from its resource version gets nothing until
an object changes or a bookmark comes, up to a minute later. The extender's /readyz counts a
watch healthy from its first event, so without the answer itself as an event it said 503 for a
minute after the API server was back (CI at f95529b, tests/cluster/test_faults.py). Here a
real HTTP server answers the watch with 200 and then sends nothing.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web
from kubernetes_asyncio import client

from gpushare_hub.kube import LedgerInformer
from gpushare_hub.kube.api import OPENED, Resource

from .helpers import node_obj

CLOSING = web.AppKey("closing", asyncio.Event)


async def quiet_api_server(
    events: list[dict[str, object]], refuse: int = 0
) -> tuple[web.AppRunner, str, list[str]]:
    """Lists one node; the first ``refuse`` watches of nodes are answered 503 (an API server
    starting), the others 200 with ``events`` and then nothing."""
    asked: list[str] = []

    async def nodes(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch", "").lower() != "true":
            body = {"kind": "NodeList", "metadata": {"resourceVersion": "7"}, "items": [node_obj("gpu-1")]}
            return web.json_response(body)
        asked.append(request.query.get("resourceVersion", ""))
        if len(asked) <= refuse:
            return web.json_response({"kind": "Status", "code": 503, "message": "starting"}, status=503)
        resp = web.StreamResponse()
        await resp.prepare(request)
        for event in events:
            await resp.write(json.dumps(event).encode() + b"\n")
        await _quiet(request)
        return resp

    async def pods(request: web.Request) -> web.StreamResponse:
        if request.query.get("watch", "").lower() != "true":
            return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": []})
        resp = web.StreamResponse()
        await resp.prepare(request)
        await _quiet(request)
        return resp

    app = web.Application()
    app[CLOSING] = asyncio.Event()
    app.on_shutdown.append(_hang_up)
    app.router.add_get("/api/v1/nodes", nodes)
    app.router.add_get("/api/v1/pods", pods)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}", asked


async def _quiet(request: web.Request) -> None:
    """Keep the watch open and send nothing, until the server shuts down."""
    await request.app[CLOSING].wait()


async def _hang_up(app: web.Application) -> None:
    app[CLOSING].set()


def api_client(host: str) -> client.ApiClient:
    conf = client.Configuration()
    conf.host = host
    return client.ApiClient(conf)


async def test_a_watch_answered_with_nothing_to_say_yields_opened_first():
    runner, host, asked = await quiet_api_server([])
    api = api_client(host)
    try:
        stream = Resource(api, "nodes").watch("7")
        etype, obj = await asyncio.wait_for(anext(stream), 10)
        assert (etype, obj) == (OPENED, {})
        assert asked == ["7"]  # resumed where it was, no list
        await stream.aclose()
    finally:
        await api.close()
        await runner.cleanup()


async def test_events_follow_the_opened_event_in_order():
    added = {"type": "ADDED", "object": node_obj("gpu-2")}
    runner, host, _ = await quiet_api_server([added])
    api = api_client(host)
    try:
        stream = Resource(api, "nodes").watch("7")
        first = await asyncio.wait_for(anext(stream), 10)
        second = await asyncio.wait_for(anext(stream), 10)
        assert first[0] == OPENED
        assert second[0] == "ADDED" and second[1]["metadata"]["name"] == "gpu-2"
        await stream.aclose()
    finally:
        await api.close()
        await runner.cleanup()


async def test_the_informer_is_not_stale_once_a_refused_watch_resumes_quietly():
    runner, host, asked = await quiet_api_server([], refuse=1)
    api = api_client(host)
    inf = LedgerInformer(api)
    try:
        await inf.start()
        for _ in range(500):  # the refused watch, then the retry 0.2 s later: answered, quiet
            if len(asked) == 2 and inf.stale_for() == 0.0:
                break
            await asyncio.sleep(0.02)
        assert asked == ["7", "7"]  # resumed from the list, never listed again
        assert inf.stale_for() == 0.0 and inf.relists == 2
        assert inf.ledger.node("gpu-1") is not None and inf.ledger.node("gpu-2") is None
    finally:
        await inf.stop()
        await api.close()
        await runner.cleanup()
