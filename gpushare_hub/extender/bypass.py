"""Warning events for pods that ask for our resource but were placed without a card choice."""

from __future__ import annotations

import asyncio
import logging

from gpushare_hub.core import GPUShareError, Ledger, PodObject, ResourceNames, demand_from_pod
from gpushare_hub.core.names import ALLOCATION_ANNOTATION, BYPASS_REASON

from .kube import Kube

log = logging.getLogger("gpushare.extender")


class BypassWarner:
    """An informer pod handler: one Warning event per pod that no gpushare extender placed.

    Pods placed by Aliyun's extender (``ALIYUN_COM_GPU_MEM_IDX``) hold a valid
    placement that the ledger reads, so they are not warned about: in a drop-in
    migration that is every running notebook.
    """

    def __init__(self, kube: Kube, ledger: Ledger, names: ResourceNames, scheduler_name: str) -> None:
        self.kube = kube
        self.ledger = ledger
        self.names = names
        self.scheduler_name = scheduler_name
        self._warned: set[str] = set()
        self._events: set[asyncio.Task[None]] = set()  # Warning events being written

    def __call__(self, etype: str, pod: PodObject) -> None:
        uid = pod.uid
        if etype == "DELETED":
            self._warned.discard(uid)
            return
        # Cheap questions first: this runs on every pod event of the cluster.
        node = pod.node_name
        if not node or self.ledger.node(node) is None:
            return
        if ALLOCATION_ANNOTATION in pod.annotations:
            return
        if uid in self._warned or pod.phase in ("Succeeded", "Failed"):
            return
        try:
            demand = demand_from_pod(pod, self.names)
        except GPUShareError:
            return
        if demand is None:
            return
        held = self.ledger.allocation(demand.key)
        if held is not None and held.node == node and (not held.uid or held.uid == uid):
            return  # placed by a gpushare extender (ours or Aliyun's): it has its card
        self._warned.add(uid)
        scheduler = pod.scheduler_name or "default-scheduler"
        message = (
            f"pod {demand.key} asks for {self.names.memory} but was placed on {node} by "
            f"{scheduler!r}, not by {self.scheduler_name!r}, so no card was chosen for it and the device "
            f"plugin cannot give it one. Set spec.schedulerName: {self.scheduler_name} (GPUShareSpawner "
            "does this) and recreate the pod."
        )
        log.warning(message)
        task = asyncio.get_running_loop().create_task(self.kube.warn(pod, BYPASS_REASON, message))
        self._events.add(task)
        task.add_done_callback(self._events.discard)
