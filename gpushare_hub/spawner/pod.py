"""The edits that make KubeSpawner's pod ask for a slice. Pure: takes the V1Pod, returns it.

Applied in :meth:`GPUShareSpawner.get_pod_manifest`, i.e. after every trait and
profile override KubeSpawner has merged into the manifest, so no override can
undo them. The notebook container (KubeSpawner's first) gets the slice in limits
and requests; every other container loses any GPU-memory resource, so the pod's
demand is exactly the slice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import V1EnvVar, V1Pod, V1ResourceRequirements, V1Toleration

from gpushare_hub.core import DEFAULT_NAMES, ResourceNames
from gpushare_hub.core.catalogue import Slice
from gpushare_hub.core.names import (
    COMPUTE_SHARE_ANNOTATION,
    EXCLUDE_MODELS_ANNOTATION,
    HUB_SERVER_ANNOTATION,
    HUB_USER_ANNOTATION,
    ISOLATION_ANNOTATION,
    MODELS_ANNOTATION,
    SLICE_ANNOTATION,
    SLICE_LABEL,
)

from .dra import apply_claim


@dataclass(frozen=True)
class SlicePod:
    """Everything the pod of a slice must carry besides what KubeSpawner made."""

    slice: Slice
    user: str
    server: str
    scheduler_name: str = "gpushare-scheduler"
    tolerations: Sequence[Mapping[str, Any]] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    names: ResourceNames = DEFAULT_NAMES
    # The DRA path: a claim from the slice's template, the default scheduler, no extended resource.
    dra: bool = False

    def resources(self) -> dict[str, str]:
        s = self.slice
        out: dict[str, str] = {}
        if self.dra:
            return out
        if s.gib is not None:
            out[self.names.memory] = str(s.gib * s.cards)
        if s.gib is None or s.cards > 1:
            out[self.names.count] = str(s.cards)
        return out

    def annotations(self) -> dict[str, str]:
        # KubeSpawner's own user and server annotations (kubectl inspect gpushare reads them), set
        # again because a profile's extra_annotations could have replaced them.
        out = {SLICE_ANNOTATION: self.slice.slug, HUB_USER_ANNOTATION: self.user}
        if self.server:
            out[HUB_SERVER_ANNOTATION] = self.server
        if self.slice.models:
            out[MODELS_ANNOTATION] = ",".join(self.slice.models)
        if self.slice.isolation:
            out[ISOLATION_ANNOTATION] = self.slice.isolation
        if self.slice.compute_share is not None:
            out[COMPUTE_SHARE_ANNOTATION] = str(self.slice.compute_share)
        return out


def _toleration(t: Mapping[str, Any]) -> V1Toleration:
    return V1Toleration(
        key=t.get("key"),
        operator=t.get("operator"),
        value=t.get("value"),
        effect=t.get("effect"),
        toleration_seconds=t.get("tolerationSeconds", t.get("toleration_seconds")),
    )


def _strip(container: Any, drop: set[str]) -> None:
    """Remove ``drop`` from a container's limits and requests. KubeSpawner passes
    ``extra_containers`` / ``init_containers`` through as plain dicts, so both forms occur."""
    resources = container.get("resources") if isinstance(container, dict) else container.resources
    if resources is None:
        return
    for part in ("limits", "requests"):
        values = resources.get(part) if isinstance(resources, dict) else getattr(resources, part)
        if values:
            kept = {k: v for k, v in values.items() if k not in drop}
            if isinstance(resources, dict):
                resources[part] = kept
            else:
                setattr(resources, part, kept)


def apply_slice(pod: V1Pod, want: SlicePod) -> V1Pod:
    """Make ``pod`` ask for ``want.slice`` and go to the gpushare scheduler (on the DRA path:
    claim it from its template, on the default scheduler)."""
    ours = {want.names.memory, want.names.count}
    spec = pod.spec
    containers = list(spec.containers or [])
    if not containers:
        raise ValueError("the pod has no container to give the GPU slice to")
    for c in [*containers[1:], *(spec.init_containers or [])]:
        _strip(c, ours)
    notebook = containers[0]
    if notebook.resources is None:
        notebook.resources = V1ResourceRequirements()
    _strip(notebook, ours)
    amounts = want.resources()
    notebook.resources.limits = {**(notebook.resources.limits or {}), **amounts}
    notebook.resources.requests = {**(notebook.resources.requests or {}), **amounts}

    meta = pod.metadata
    replaced = (MODELS_ANNOTATION, EXCLUDE_MODELS_ANNOTATION, HUB_SERVER_ANNOTATION, COMPUTE_SHARE_ANNOTATION)
    annotations = {k: v for k, v in (meta.annotations or {}).items() if k not in replaced}
    annotations.update(want.annotations())
    meta.annotations = annotations
    meta.labels = {**(meta.labels or {}), SLICE_LABEL: want.slice.slug}

    if want.dra:
        apply_claim(pod, want.slice, want.scheduler_name)
    else:
        spec.scheduler_name = want.scheduler_name
    if want.node_selector:
        spec.node_selector = {**(spec.node_selector or {}), **want.node_selector}
    if want.tolerations:
        spec.tolerations = [*(spec.tolerations or []), *(_toleration(t) for t in want.tolerations)]
    return pod


NO_CARD = ("NVIDIA_VISIBLE_DEVICES", "void")  # the NVIDIA runtime's words for "no card"
WHOLE_GPU = "nvidia.com/gpu"


def without_cards(pod: V1Pod, names: ResourceNames) -> V1Pod:
    """A pod whose notebook container asks for no GPU (no slice, no card count, no
    ``nvidia.com/gpu``) gets ``NVIDIA_VISIBLE_DEVICES=void``, unless it names one itself: where
    the NVIDIA runtime runs it (the default runtime on a legacy node, or a runtime class), a CUDA
    image's ``NVIDIA_VISIBLE_DEVICES=all`` would otherwise give it every card of the node. A pod
    that asks for GPU resources gets its cards from the device plugin's Allocate, whose variables
    the pod's own would override."""
    containers = list(pod.spec.containers or [])
    if not containers:
        return pod
    notebook = containers[0]
    resources = notebook.resources
    asked = {
        *((resources.limits or {}) if resources else {}),
        *((resources.requests or {}) if resources else {}),
    }
    if asked & {names.memory, names.count, WHOLE_GPU}:
        return pod
    env = list(notebook.env or [])
    if any((e.get("name") if isinstance(e, dict) else e.name) == NO_CARD[0] for e in env):
        return pod
    notebook.env = [*env, V1EnvVar(name=NO_CARD[0], value=NO_CARD[1])]
    return pod
