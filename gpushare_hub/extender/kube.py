"""The extender's API calls besides list and watch (those are the informer's): read a pod,
bind it, record an event. Every call has a timeout."""

from __future__ import annotations

import logging
from typing import Any

from kubernetes_asyncio import client

from gpushare_hub.core.objects import PodObject
from gpushare_hub.core.shapes import read_pod
from gpushare_hub.kube.api import DEFAULT_TIMEOUTS, ApiError, Timeouts, checked, json_of, make_api_client
from gpushare_hub.kube.events import warning_event

log = logging.getLogger("gpushare.extender")
CLAIM_API_VERSION = "resource.k8s.io/v1"  # the ResourceClaims the ledger counts

__all__ = ["ApiError", "Kube", "make_api_client"]


class Kube:
    def __init__(
        self, api: client.ApiClient, timeouts: Timeouts = DEFAULT_TIMEOUTS, bind_timeout: float = 4.0
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.timeouts = timeouts
        # Below kube-scheduler's httpTimeout for the extender (5 s), so that the
        # scheduler hears our answer, not its own timeout.
        self.bind_timeout = bind_timeout

    async def close(self) -> None:
        await self.api.close()

    async def get_pod(self, namespace: str, name: str) -> PodObject:
        result: dict[str, Any] = await json_of(
            self.core.read_namespaced_pod(
                name,
                namespace,
                _preload_content=False,
                _request_timeout=self.timeouts.call(self.bind_timeout),
            )
        )
        return read_pod(result)

    async def get_claim_template(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ResourceClaimTemplate as API JSON (resource.k8s.io/v1), None when there is none; the
        prioritize-only verb reads it within kube-scheduler's httpTimeout (as bind does)."""
        try:
            result: dict[str, Any] = await json_of(
                client.ResourceV1Api(self.api).read_namespaced_resource_claim_template(
                    name,
                    namespace,
                    _preload_content=False,
                    _request_timeout=self.timeouts.call(self.bind_timeout / 2),
                )
            )
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return result

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
        resp = await checked(
            self.core.create_namespaced_pod_binding(
                name,
                namespace,
                body,
                _preload_content=False,
                _request_timeout=self.timeouts.call(self.bind_timeout),
            )
        )
        resp.release()

    async def warn(self, pod: PodObject, reason: str, message: str) -> None:
        """A Warning event on the pod (``kubectl describe pod`` shows it); best effort."""
        namespace = pod.namespace or "default"
        involved = {"kind": "Pod", "name": pod.name, "namespace": namespace, "uid": pod.uid}
        await self._event(involved, namespace, reason, message)

    async def warn_claim(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        """A Warning event on a ResourceClaim (``kubectl describe resourceclaim`` shows it): a
        claim no pod is reserved for yet has no pod to warn; best effort."""
        involved = {
            "apiVersion": CLAIM_API_VERSION,
            "kind": "ResourceClaim",
            "name": name,
            "namespace": namespace,
            "uid": uid,
        }
        await self._event(involved, namespace, reason, message)

    async def warn_node(self, node: str, reason: str, message: str) -> None:
        """A Warning event on the Node (``kubectl describe node`` shows it: as the kubelet's own
        events do, the Node's name stands for its UID); best effort."""
        await self._event({"kind": "Node", "name": node, "uid": node}, "default", reason, message)

    async def _event(self, involved: dict[str, str], namespace: str, reason: str, message: str) -> None:
        event: Any = warning_event(involved, namespace, reason, message, "gpushare-extender")
        try:
            resp = await checked(
                self.core.create_namespaced_event(
                    namespace,
                    event,
                    _preload_content=False,
                    _request_timeout=self.timeouts.call(),
                )
            )
            resp.release()
        except Exception as err:
            log.warning("could not record event for %s %s: %s", involved["kind"], involved["name"], err)
