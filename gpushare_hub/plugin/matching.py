"""Which pod an Allocate call is for, and what its container gets (pure).

The kubelet tells Allocate only the device IDs of one container, never the pod.
What makes the answer unambiguous:

* the extender wrote, per container, the card UUID and units it chose
  (``gpushare-hub.io/allocation``);
* on nodes served by this plugin (Node annotation ``gpushare-hub.io/allocator``)
  the extender keeps the rule of :mod:`gpushare_hub.core.handout`: all unserved
  containers whose Allocate will ask ``n`` devices want the same card(s);
* the plugin marks each pod ``ALIYUN_COM_GPU_MEM_ASSIGNED=true`` once all its
  containers are served, and remembers containers it served in between.

Annotations are untrusted: records are read under the core's one rule (the pod
asks the resource, is bound to this node, the cards are this node's, no card
over-committed), the same reader the extender's ledger uses.

So the candidates for an Allocate of ``n`` units are the unserved containers
of ``n`` units on this node (their handouts of size ``n``); if they disagree
about the card, the call fails with the pods named rather than guessing, even
when the device IDs come from one card (gpushare's plugin matched on the amount
alone and swapped pods). Among agreeing candidates the oldest placement is
served first; they are interchangeable.

Whole cards (``aliyun.com/gpu-count``, a second resource the plugin registers with one
device per card) are matched the same way, by their own handouts
(:func:`~gpushare_hub.core.handout.count_handouts`): an Allocate of ``n`` such devices is
for an unserved container asking ``n`` whole cards, and the answer is the cards the
extender wrote, never the device IDs the kubelet picked.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from gpushare_hub.core.cards import Card, Node
from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.handout import count_handouts, handouts
from gpushare_hub.core.ledger import Ledger
from gpushare_hub.core.names import (
    CARD_UUIDS_ENV,
    COMPUTE_SHARE_ANNOTATION,
    CONTAINER_LEDGER_DIR,
    GPU_MEM_ASSUME_TIME,
    LEDGER_DIR_ENV,
)
from gpushare_hub.core.objects import PodObject
from gpushare_hub.core.records import IgnoredRecord
from gpushare_hub.core.resources import DEFAULT_NAMES, ResourceNames

log = logging.getLogger("gpushare.plugin")

MEMORY = "memory"
COUNT = "count"


class NoMatch(GPUShareError):
    """Allocate cannot tell which pod it serves; the message says why and what to check."""


@dataclass(frozen=True)
class Waiting:
    """A container that the extender gave a slice to and that the plugin has not served yet.

    ``units``: what its Allocate asks; ``cards``: every card it gets (``uuid`` is the first).
    ``resource``: which resource's Allocate serves it (MEMORY: units of gpu-mem; COUNT: whole
    cards of gpu-count); ``alone``: a COUNT handout of a container that asks no gpu-mem (its
    Allocate answers the cards; otherwise the gpu-mem Allocate does).
    """

    pod: str
    uid: str
    container: str
    uuid: str
    units: int
    pod_units: int
    assumed_ns: int
    cards: tuple[str, ...] = ()
    resource: str = MEMORY
    alone: bool = False
    compute_share: str | None = None  # the pod's gpushare-hub.io/compute-share, as written

    @property
    def served_key(self) -> str:
        """The name under which the plugin remembers the container served (per resource;
        container names are DNS labels, so no ``@`` ever occurs in one)."""
        return self.container if self.resource == MEMORY else f"{self.container}@{self.resource}"


def waiting_containers(
    pods: Iterable[PodObject],
    node: Node,
    served: set[tuple[str, str]],
    names: ResourceNames = DEFAULT_NAMES,
    ignored: list[IgnoredRecord] | None = None,
) -> list[Waiting]:
    """Unserved containers of pods placed on ``node`` and not yet marked assigned.

    ``served``: (pod UID, container) pairs this plugin already allocated. Records are
    read under the core's one rule (:mod:`gpushare_hub.core.records`), checked against
    this node's own cards: a forged or over-committing record is left out, and
    appended to ``ignored`` when given.
    """
    pods = list(pods)
    ledger = Ledger(names)
    ledger.set_node(node)
    for pod in pods:
        try:
            refused = ledger.observe_pod(pod)
        except GPUShareError as err:  # one pod nobody can read must not fail every Allocate on the node
            log.warning("pod %s on node %s gets no card: %s", pod.key, node.name, err)
            continue
        if refused is not None and ignored is not None:
            ignored.append(refused)
    out = []
    for pod in pods:
        if pod.deletion_timestamp:
            continue
        uid = pod.uid
        alloc = ledger.allocation(pod.key)
        if alloc is None or alloc.assigned or alloc.uid != uid or alloc.node != node.name:
            continue
        try:
            assumed = int(pod.annotations.get(GPU_MEM_ASSUME_TIME, "0"))
        except ValueError:
            assumed = 0
        mem = handouts(alloc.containers)
        for h in mem:
            if (uid, h.container) not in served:
                share = pod.annotations.get(COMPUTE_SHARE_ANNOTATION)
                w = Waiting(
                    alloc.key, uid, h.container, h.cards[0], h.size, alloc.units, assumed, h.cards,
                    compute_share=share,
                )  # fmt: skip
                out.append(w)
        cards = [c.uuid for c in alloc.cards]
        with_mem = {h.container for h in mem}
        for h in count_handouts(pod, cards, names.count):
            w = Waiting(
                alloc.key, uid, h.container, h.cards[0], h.size, alloc.units, assumed, h.cards,
                resource=COUNT, alone=h.container not in with_mem,
            )  # fmt: skip
            if (uid, w.served_key) not in served:
                out.append(w)
    return out


def match(
    device_ids: list[str], waiting: list[Waiting], node: str, unit: str = "GiB", resource: str = MEMORY
) -> Waiting:
    """The container an Allocate of these device IDs is for, or NoMatch naming the cause."""
    n = len(device_ids)
    if n == 0:
        raise NoMatch("Allocate was called with no device IDs")
    waiting = [w for w in waiting if w.resource == resource]
    if resource == COUNT:
        unit = "whole-card"
    candidates = [w for w in waiting if w.units == n]
    if not candidates:
        sizes = sorted({w.units for w in waiting})
        what = "slice" if resource == MEMORY else "allocation"
        raise NoMatch(
            f"no pod on node {node} waits for a {n} {unit} {what} "
            f"(waiting sizes: {sizes or 'none'}); a pod that asks aliyun.com/gpu-mem or "
            "aliyun.com/gpu-count must be scheduled by gpushare-scheduler, which writes the "
            "cards it chose on the pod"
        )
    if len({w.cards or (w.uuid,) for w in candidates}) > 1:
        # Never guessed from the device IDs: which IDs the kubelet picked says nothing of the pod.
        who = ", ".join(
            f"{w.pod} ({w.container}, card {'+'.join(w.cards or (w.uuid,))})" for w in candidates[:4]
        )
        raise NoMatch(
            f"ambiguous Allocate of {n} {unit} on node {node}: {who} all wait for that amount on "
            "different cards. The extender prevents this on nodes annotated gpushare-hub.io/allocator; "
            "check that the annotation is on the node and that only one extender serves the cluster"
        )
    return min(candidates, key=lambda w: (w.assumed_ns, w.pod, w.container))


def container_env(w: Waiting, card: Card, mib_per_unit: int) -> dict[str, str]:
    """What the container sees: its card by UUID, the gpushare variables, and memory caps."""
    limit_mib = w.units * mib_per_unit
    fraction = f"{min(1.0, limit_mib / max(1, card.mib or limit_mib)):.3f}"
    cards = ",".join(w.cards or (w.uuid,))
    return {
        "NVIDIA_VISIBLE_DEVICES": cards,
        CARD_UUIDS_ENV: cards,
        "ALIYUN_COM_GPU_MEM_IDX": str(card.index),
        "ALIYUN_COM_GPU_MEM_POD": str(w.pod_units),
        "ALIYUN_COM_GPU_MEM_CONTAINER": str(w.units),
        "ALIYUN_COM_GPU_MEM_DEV": str(card.units),
        # HAMi-core style isolation layers read this where an admin installed one.
        "CUDA_DEVICE_MEMORY_LIMIT_0": f"{limit_mib}m",
        # Frameworks that honour an environment cap.
        "GPUSHARE_MEMORY_LIMIT_MIB": str(limit_mib),
        # The start-up hook turns the slice into PyTorch's fraction before CUDA starts.
        "GPUSHARE_CARD_MEMORY_MIB": str(card.mib or limit_mib),
        # ... and counts every GPU process of the container against the one slice.
        LEDGER_DIR_ENV: CONTAINER_LEDGER_DIR,
        "CUPY_GPU_MEMORY_LIMIT": str(limit_mib * 1024 * 1024),
        # One name only: JAX 0.11 refuses XLA_CLIENT_MEM_FRACTION beside this one and falls back
        # to the CPU (measured on an H100); this one, deprecated there, is read by every JAX.
        "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction,
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
