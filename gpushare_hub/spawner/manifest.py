"""The slice's pod: KubeSpawner's manifest with the slice applied (:mod:`.pod`), the GPU pods'
scheduler, tolerations and node selector, and the server's environment."""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio.client import V1Pod
from traitlets import Dict, List, Unicode

from gpushare_hub.core.catalogue import Slice
from gpushare_hub.core.names import DRA_SCHEDULER_NAME, RETURNED_ENV, SERVICE_URL_ENV

from .dra import DEFAULT_SCHEDULER, DRA
from .options import RETURNED_KEY, returned_problem
from .pod import SlicePod, apply_slice, without_cards
from .settings import SliceSettings


class SliceManifest(SliceSettings):
    """``get_pod_manifest``, ``get_env`` and ``slice_pod``, with their settings."""

    service_url = Unicode(
        "",
        config=True,
        help="""
        Where notebook servers reach the gpushare hub service, ending in its prefix, e.g.
        ``http://hub:10101/services/gpushare/`` (``configure_hub`` sets it). Given to each server
        as ``GPUSHARE_SERVICE_URL``: the JupyterLab status bar and the out-of-memory note ask the
        service's ``api/v1/me`` with the server's own token. Empty: they say the service is not
        configured.
        """,
    )

    dra_scheduler_name = Unicode(
        DEFAULT_SCHEDULER,
        config=True,
        help=f"""
        ``spec.schedulerName`` of GPU-slice pods when ``allocation = "dra"``. The default,
        ``default-scheduler``, places them by first fit and the default spreading. With the
        gpushare-hub chart's ``dra.scheduler: gpushare``, set it to that chart's DRA profile,
        ``{DRA_SCHEDULER_NAME}``: our dedicated scheduler then packs them across nodes as
        binpack does (docs/dra.md). Either must be a kube-scheduler 1.36 or newer.
        """,
    )

    gpu_tolerations = List(
        Dict(),
        config=True,
        help="""
        Tolerations added to GPU-slice pods (Kubernetes format), e.g.
        ``[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]``.
        """,
    )

    gpu_node_selector = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        config=True,
        help="""Node selector merged into GPU-slice pods, e.g. ``{"gpushare": "true"}``.""",
    )

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        if self.service_url:
            env[SERVICE_URL_ENV] = self.service_url
        options: Any = getattr(self, "user_options", None)
        ret: Any = options.get(RETURNED_KEY) if isinstance(options, dict) else None
        if ret is not None and not returned_problem(ret):  # checked at load_user_options too
            env[RETURNED_ENV] = json.dumps(ret)
        return env

    async def get_pod_manifest(self) -> V1Pod:
        """KubeSpawner's manifest, then the slice: after every override, so none can undo it."""
        pod: V1Pod = await super().get_pod_manifest()
        chosen = self._gpushare_chosen
        if chosen is None or self.gpushare_slice is None:
            return without_cards(pod, self.resource_names)
        return apply_slice(pod, self.slice_pod(chosen))

    def slice_pod(self, chosen: Slice) -> SlicePod:
        dra = self.allocation == DRA
        return SlicePod(
            slice=chosen,
            user=str(self.user.name),
            server=str(self.name or ""),
            scheduler_name=self.dra_scheduler_name if dra else self.gpushare_scheduler_name,
            tolerations=list(self.gpu_tolerations),
            node_selector=dict(self.gpu_node_selector),
            names=self.resource_names,
            dra=dra,
        )
