"""The node's ResourceSlice on the API server, kept as the plugin wants it.

Published at start, when the kubelet registers the plugin (a kubelet deletes its node's slices at
its own start and 30 s after the driver went away), when the cards, their health or their order
change, and checked every few seconds: a slice deleted by anyone is written again. The pool's
generation is bumped on every change, so the scheduler never mixes an old slice with a new one.
A slice of our driver for this node that another writer changed is replaced by ours (the chart's
admission policy lets only this node's plugin write it). On the way out the slice is deleted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpushare_hub.core.draslice import API_VERSION, same_content, slice_name
from gpushare_hub.kube.rest import ApiStatusError, RestClient

log = logging.getLogger("gpushare.dra")

SLICES = f"/apis/{API_VERSION}/resourceslices"


class SlicePublisher:
    """``wanted(generation)``: the slice as it should be now, at that generation."""

    def __init__(self, api: RestClient, node: str, wanted: Callable[[int], dict[str, Any]]) -> None:
        self.api = api
        self.node = node
        self.wanted = wanted
        self.generation = 0
        self._last: dict[str, Any] | None = None  # what we last wrote
        self._stored: dict[str, Any] | None = None  # what the API server made of it
        self.capacity_off = False
        self._lock = threading.Lock()

    @property
    def path(self) -> str:
        return f"{SLICES}/{slice_name(self.node)}"

    def publish(self) -> bool:
        """Make the API server's slice ours; True when something was written.

        Nothing is written while the slice on the API server is the one we last wrote (same
        resourceVersion) and we want what we wanted then: the server may spell what it stored
        otherwise than we did (quantities, defaults), so what it stored is never compared with
        what we would write."""
        with self._lock:
            try:
                current = self.api.get(self.path)
            except ApiStatusError as err:
                if err.status != 404:
                    raise
                current = None
            want = self.wanted(self.generation)
            if self._unchanged(current, want):
                return False
            server_gen = 0
            if current is not None:
                raw = ((current.get("spec") or {}).get("pool") or {}).get("generation")
                server_gen = raw if isinstance(raw, int) and not isinstance(raw, bool) else 0
            self.generation = max(self.generation, server_gen) + 1
            want = self.wanted(self.generation)
            if current is None:
                stored = self.api.post(SLICES, want)
                verb = "published"
            else:
                want["metadata"]["resourceVersion"] = _version(current)
                stored = self.api.request("PUT", self.path, body=want)
                verb = "updated"
            log.info("%s ResourceSlice %s (generation %d)", verb, slice_name(self.node), self.generation)
            self._last, self._stored = want, stored if isinstance(stored, dict) else None
            self.check_stored(want, stored)
            return True

    def _unchanged(self, current: Any, want: dict[str, Any]) -> bool:
        if current is None or self._last is None or self._stored is None:
            return False
        return _version(current) == _version(self._stored) and same_content(self._last, want)

    def check_stored(self, want: dict[str, Any], stored: Any) -> None:
        """Say once, loudly, when the API server dropped what sharing needs: a cluster without
        consumable capacity (before 1.36, unless DRAConsumableCapacity is on) stores the devices
        without ``allowMultipleAllocations``, and then each card goes whole to one claim."""
        devices = ((stored or {}).get("spec") or {}).get("devices") or []
        dropped = bool(want["spec"]["devices"]) and not any(
            isinstance(d, dict) and d.get("allowMultipleAllocations") for d in devices
        )
        if dropped and not self.capacity_off:
            log.error(
                "the API server dropped allowMultipleAllocations and the memory request policy from "
                "ResourceSlice %s: consumable capacity is off on this cluster (Kubernetes 1.36+ has it on; "
                "1.34-1.35 need the feature gate DRAConsumableCapacity on the API server, the scheduler "
                "and the kubelet). Until then a claim gets a whole card: use the device-plugin path "
                "(docs/dra.md)",
                slice_name(self.node),
            )
        self.capacity_off = dropped

    def try_publish(self) -> None:
        try:
            self.publish()
        except Exception as err:  # logged, tried again at the next check
            log.warning("could not publish ResourceSlice %s: %s", slice_name(self.node), err)

    def run(self, stop: threading.Event, interval: float) -> None:
        while not stop.wait(interval):
            self.try_publish()

    def delete(self) -> None:
        try:
            self.api.request("DELETE", self.path)
            log.info("deleted ResourceSlice %s", slice_name(self.node))
        except ApiStatusError as err:
            if err.status != 404:
                log.warning("could not delete ResourceSlice %s: %s", slice_name(self.node), err)
        except Exception as err:
            log.warning("could not delete ResourceSlice %s: %s", slice_name(self.node), err)


def _version(obj: Any) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "")


class KubeClaims:
    """Reads claims for Prepare (the plugin's RBAC: get on resourceclaims)."""

    def __init__(self, api: RestClient) -> None:
        self.api = api

    def claim(self, namespace: str, name: str) -> Any:
        try:
            return self.api.get(f"/apis/{API_VERSION}/namespaces/{namespace}/resourceclaims/{name}")
        except ApiStatusError as err:
            if err.status == 404:
                raise LookupError("no such ResourceClaim on the API server") from None
            raise
