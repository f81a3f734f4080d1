"""The slice's pod: KubeSpawner's manifest with the slice applied (:mod:`.pod`), the GPU pods'
scheduler, tolerations and node selector, room for hibernating kernels' copies
(:mod:`.hibernation`), and the server's environment."""

from __future__ import annotations

import json
from typing import Any

from jupyterhub.traitlets import ByteSpecification  # type: ignore[import-untyped]
from kubernetes_asyncio.client import V1Pod, V1ResourceRequirements
from traitlets import Bool, Dict, List, Unicode

from gpushare_hub.core.catalogue import CatalogueError, Slice
from gpushare_hub.core.names import DRA_SCHEDULER_NAME, RETURNED_ENV, SERVICE_URL_ENV

from .dra import DEFAULT_SCHEDULER, DRA
from .hibernation import BASE_DEFAULT, HIBERNATION_TRAIT, Offer, pod_limit, too_small
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

    gpu_hibernation = Bool(
        False,
        config=True,
        help="""
        The notebook servers may hibernate idle kernels (the hub service's idle action
        ``"hibernate"``): their extension copies an idle kernel's GPU memory into the pod's host
        memory and gives the card's memory back, and the next cell restores it. The copy counts
        against the pod's memory limit, so with this on a GPU-slice pod without a memory limit
        gets ``mem_limit`` = the slice's GiB × its cards (a whole card: the largest model it may
        get) + ``gpu_hibernation_base_memory``, and a ``mem_limit`` set smaller (the spawner's,
        or a profile's ``kubespawner_override``) stops the hub at start, naming the profile and
        the smallest limit that works. Kubernetes takes a limit without a request as the
        request: set ``mem_guarantee`` to reserve less on the node. Off: pods are unchanged.
        """,
    )

    gpu_hibernation_base_memory = ByteSpecification(
        BASE_DEFAULT,
        config=True,
        help="""
        With ``gpu_hibernation``: the memory a notebook server needs besides its kernels' GPU
        copies (the server, the kernels' own host memory), in ``mem_limit``'s form (``"2G"``,
        ``"512M"``, bytes). A slice pod's smallest memory limit is its slice plus this.
        """,
    )

    def get_env(self) -> dict[str, str]:
        env: dict[str, str] = super().get_env()
        limit = self._hibernation_limit()
        if limit is not None:  # as KubeSpawner tells a server a set limit (jupyter-resource-usage reads it)
            env["MEM_LIMIT"] = str(limit)
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
        self._check_hibernation_limit(chosen)
        limit = self._hibernation_limit()
        notebook = pod.spec.containers[0] if pod.spec.containers else None
        if limit is not None and notebook is not None:
            resources = notebook.resources or V1ResourceRequirements()
            limits: dict[str, Any] = {"memory": limit, **(resources.limits or {})}  # a set one stays
            resources.limits = limits
            notebook.resources = resources
        return apply_slice(pod, self.slice_pod(chosen))

    def _hibernation_limit(self) -> int | None:
        """The memory limit hibernation gives a slice's pod without one (None: none given)."""
        chosen = self._gpushare_chosen
        if not self.gpu_hibernation or chosen is None or self.gpushare_slice is None or self.mem_limit:
            return None
        if "memory" in (self.extra_resource_limits or {}):  # the admin's, as a Kubernetes quantity
            return None
        base, guarantee = self.gpu_hibernation_base_memory, self.mem_guarantee
        return pod_limit(chosen, base, guarantee, self.resource_names)

    def _check_hibernation_limit(self, chosen: Slice) -> None:
        """A limit too small for the kernels' copies that the hub's start could not see (a
        callable profile_list, an unlisted choice) fails the spawn naming it."""
        if not self.gpu_hibernation or not self.mem_limit:
            return
        options: Any = getattr(self, "user_options", None)
        slug = str(options.get("profile") or chosen.slug) if isinstance(options, dict) else chosen.slug
        offer = Offer(
            chosen.display_name, slug, chosen, self.mem_limit, "the spawner's, or the chosen profile's"
        )
        problem = too_small(offer, self.gpu_hibernation_base_memory, self.resource_names)
        if problem:
            self.log.error("%s is on, but %s", HIBERNATION_TRAIT, problem)
            raise CatalogueError(f"{HIBERNATION_TRAIT} is on, but {problem}")

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
