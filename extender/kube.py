"""Talking to the API server (kubernetes_asyncio): list, watch, bind, events.

Objects are handled as the API server's JSON (camelCase dicts), which is what
the core reads; nothing is converted to client model classes on the hot path.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger("gpushare.extender")

Handler = Callable[[str, dict[str, Any]], None]


async def make_api_client(kubeconfig: str | None, in_cluster: bool) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, or the pod's service account in-cluster."""
    if in_cluster:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    return await config.new_client_from_config(config_file=kubeconfig)


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)

    async def close(self) -> None:
        await self.api.close()

    @staticmethod
    async def _checked(call: Awaitable[Any]) -> Any:
        """Await a ``_preload_content=False`` call and raise on a non-2xx answer.

        kubernetes_asyncio checks the status only when it parses the body itself;
        with raw responses a 404 or 409 would otherwise look like success.
        """
        resp = await call
        if not 200 <= resp.status <= 299:
            body = await resp.read()
            resp.release()
            try:
                message = json.loads(body).get("message", "")
            except (ValueError, AttributeError):
                message = body.decode(errors="replace")[:200]
            raise ApiException(status=resp.status, reason=message or resp.reason)
        return resp

    async def _raw(self, call: Awaitable[Any]) -> Any:
        resp = await self._checked(call)
        try:
            return json.loads(await resp.read())
        finally:
            resp.release()

    async def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        body = await self._raw(self.core.list_node(_preload_content=False))
        return body["items"], body["metadata"]["resourceVersion"]

    async def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        body = await self._raw(self.core.list_pod_for_all_namespaces(_preload_content=False))
        return body["items"], body["metadata"]["resourceVersion"]

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._raw(
            self.core.read_namespaced_pod(name, namespace, _preload_content=False)
        )
        return result

    async def watch(self, kind: str, resource_version: str, on_event: Handler) -> None:
        """Stream events for ``kind`` (``nodes`` or ``pods``) until the server ends the watch.

        Reads the newline-delimited JSON itself: one ``json.loads`` per event and
        no conversion to client models (the library's Watch decodes every event
        twice). Returns when the watch expires; raises ApiException for an ERROR
        event (410 when the resource version is too old: the caller lists again).
        BOOKMARK events are passed on so that the caller keeps its resource version.
        """
        func = self.core.list_node if kind == "nodes" else self.core.list_pod_for_all_namespaces
        resp = await self._checked(
            func(
                watch=True,
                resource_version=resource_version,
                timeout_seconds=240,
                allow_watch_bookmarks=True,
                _preload_content=False,
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
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    on_event(etype, obj)
        finally:
            resp.release()

    async def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        """Bind and write the annotations in one atomic update (the binding subresource merges them)."""
        body: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": annotations,
                **({"uid": uid} if uid else {}),
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        resp = await self._checked(
            self.core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False)
        )
        resp.release()

    async def warn(self, pod: dict[str, Any], reason: str, message: str) -> None:
        meta = pod["metadata"]
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta.get("namespace", "default")},
            "involvedObject": {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": meta["name"],
                "namespace": meta.get("namespace", "default"),
                "uid": meta.get("uid", ""),
            },
            "type": "Warning",
            "reason": reason,
            "message": message,
            "source": {"component": "gpushare-extender"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            resp = await self._checked(
                self.core.create_namespaced_event(
                    meta.get("namespace", "default"), event, _preload_content=False
                )
            )
            resp.release()
        except ApiException as err:
            log.warning("could not record event for pod %s: %s", meta["name"], err.reason)


async def sleep_backoff(attempt: int) -> None:
    await asyncio.sleep(min(10.0, 0.2 * 2**attempt))
