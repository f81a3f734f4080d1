"""The DRA path of GPUShareSpawner (``allocation = "dra"``, docs/dra.md). Pure: no I/O.

A slice's pod names the chart's ResourceClaimTemplate of its slice
(``gpushare-slice-<slug>``) as its pod claim ``gpushare-gpu``, and the notebook container uses
that claim; it asks no extended resource and goes to the default scheduler, which allocates
the claim from our driver's ResourceSlices. The default scheduler's words about claims are
turned into sentences a notebook user understands (:func:`user_words`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio.client import CoreV1ResourceClaim, V1Pod, V1PodResourceClaim, V1ResourceRequirements

from gpushare_hub.core.catalogue import Catalogue, CatalogueError, Slice
from gpushare_hub.core.names import DRA_DEVICE_CLASS, DRA_POD_CLAIM, DRA_TEMPLATE_PREFIX

DEVICE_PLUGIN = "device-plugin"
DRA = "dra"
ALLOCATIONS = (DEVICE_PLUGIN, DRA)
# kube-scheduler's own profile: it allocates claims with consumable capacity from 1.36 (Zero to
# JupyterHub 4.4's user-scheduler is a 1.35 kube-scheduler, where that is off).
DEFAULT_SCHEDULER = "default-scheduler"


def template_name(s: Slice) -> str:
    return f"{DRA_TEMPLATE_PREFIX}{s.slug}"


def dra_problem(s: Slice) -> str | None:
    """Why ``s`` cannot be offered on the DRA path (None: it can). A claim template asks one
    share of one card, so whole cards, several cards and a required isolation tier are not."""
    fix = "offer it with allocation = 'device-plugin', or take it out of the catalogue"
    if s.gib is None:
        return f"slice {s.slug!r} is a whole card: the DRA path gives shares of one card only ({fix})"
    if s.cards > 1:
        return f"slice {s.slug!r} asks {s.cards} cards: the DRA path gives a share of one card ({fix})"
    if s.isolation:
        return (
            f"slice {s.slug!r} requires isolation {s.isolation!r}: the DRA path's claim templates "
            f"do not select on isolation yet ({fix})"
        )
    if s.compute_share is not None:
        return (
            f"slice {s.slug!r} sets compute_share {s.compute_share}%: on the DRA path a claim's MPS "
            "share follows its memory (the plugin cannot tell which catalogue entry a claim came "
            "from), so the form would promise a share the pod does not get (remove compute_share "
            "from it, or offer it with allocation = 'device-plugin')"
        )
    return None


def check_dra_catalogue(catalogue: Catalogue) -> None:
    """Raise :class:`CatalogueError` naming every slice the DRA path cannot offer."""
    problems = [p for s in catalogue.slices if (p := dra_problem(s))]
    if problems:
        raise CatalogueError("GPUShareSpawner.allocation is 'dra', but " + "; ".join(problems))


def _name(item: Any) -> Any:
    """A claim's name; KubeSpawner passes extra_pod_config's through as plain dicts."""
    return item.get("name") if isinstance(item, dict) else getattr(item, "name", None)


def apply_claim(pod: V1Pod, s: Slice, scheduler_name: str = DEFAULT_SCHEDULER) -> V1Pod:
    """Give ``pod`` the slice's claim: the pod claim from the slice's template, used by the
    notebook container (KubeSpawner's first), whose resources stay as they are otherwise; it goes
    to ``scheduler_name`` (the default scheduler, or the chart's DRA profile with dra.scheduler:
    gpushare, :data:`~gpushare_hub.core.names.DRA_SCHEDULER_NAME`)."""
    spec = pod.spec
    others = [c for c in (spec.resource_claims or []) if _name(c) != DRA_POD_CLAIM]
    spec.resource_claims = [
        *others,
        V1PodResourceClaim(name=DRA_POD_CLAIM, resource_claim_template_name=template_name(s)),
    ]
    notebook = spec.containers[0]
    if notebook.resources is None:
        notebook.resources = V1ResourceRequirements()
    claims = [c for c in (notebook.resources.claims or []) if _name(c) != DRA_POD_CLAIM]
    notebook.resources.claims = [*claims, CoreV1ResourceClaim(name=DRA_POD_CLAIM)]
    spec.scheduler_name = scheduler_name or DEFAULT_SCHEDULER
    return pod


# The default scheduler's (DynamicResources plugin, kube-scheduler 1.36/1.37), the claim
# controller's and the kubelet's words about a pod's claims, in the order tried, each with what
# a user is told. ``s``: the server's slice. An event's message is anyone's text (a pod's owner
# writes Events too): only its first MAX_MESSAGE characters are read, and no pattern repeats
# without a bound, so a match costs a bounded number of steps from each start (no backtracking
# over the whole message).
MAX_MESSAGE = 4096
Words = Callable[[Slice], str]
_ADMIN = "ask the hub's admin"
WORDS: tuple[tuple[re.Pattern[str], Words], ...] = (
    (
        re.compile(r'resource claim template "[^"]{0,253}": \S{0,80} "[^"]{0,253}" not found', re.I),
        lambda s: (
            f"This server cannot start: the cluster has no claim template {template_name(s)} for the "
            f"{s.display_name} slice in this namespace ({_ADMIN}: the gpushare-hub chart's dra.slices "
            "and dra.namespace)."
        ),
    ),
    (
        re.compile(r"device class \S{1,253} does not exist", re.I),
        lambda s: (
            f"This server cannot start: the cluster has no {DRA_DEVICE_CLASS} device class "
            f"({_ADMIN}: the gpushare-hub chart's dra.enabled)."
        ),
    ),
    (
        re.compile(r"cannot allocate all claims|resourceclaim not available on the node", re.I),
        lambda s: (
            f"No card has {s.gib} GiB free right now{_on(s)}: your server waits until another "
            "server returns its slice, then starts by itself."
        ),
    ),
    (
        re.compile(r'ResourceClaim not created yet|resourceclaim\S{0,80} "[^"]{0,253}" not found', re.I),
        lambda s: "The cluster is making your server's GPU claim; this takes a few seconds.",
    ),
    (
        re.compile(r"in the process of being allocated", re.I),
        lambda s: f"The scheduler is giving your server its {s.gib} GiB slice.",
    ),
    (
        re.compile(r"resourceclaim in use|is being deleted", re.I),
        lambda s: "Your server's previous GPU claim is still being returned; the new one follows.",
    ),
    (
        re.compile(r"NodePrepareResources failed|Failed to prepare dynamic resources", re.I),
        lambda s: (
            "The node could not set up your GPU slice; the server is tried again. If this "
            f"stays, {_ADMIN} (the gpushare-dra-plugin pod on that node)."
        ),
    ),
    (
        re.compile(r"ResourceClaim \S{1,253} is not allocated|\bnot allocated\b", re.I),
        lambda s: "The scheduler has not given your server a slice yet; it waits for a card with room.",
    ),
)


def _on(s: Slice) -> str:
    return f" on a {'/'.join(s.models)}" if s.models else ""


def user_words(message: str, s: Slice) -> str | None:
    """A sentence for a user about the Kubernetes ``message`` on the server's pod (an event's or
    the scheduler's), or None when it says nothing about the slice's claim. Only the first
    :data:`MAX_MESSAGE` characters are read (the scheduler's words come first)."""
    head = message[:MAX_MESSAGE]
    for pattern, words in WORDS:
        if pattern.search(head):
            return words(s)
    return None
