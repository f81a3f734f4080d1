"""The rule that lets the device plugin know which container an Allocate is for (pure).

The kubelet calls Allocate once per container with that container's device IDs,
never naming the pod. A container's **handout** is what that call will be: its
size (how many devices, i.e. the units the container asks) and the card(s) the
extender chose for it. An Allocate of ``n`` devices is for one of the node's
containers whose handout has size ``n`` and that has not been served yet.

The rule, used by the extender when it places and by the plugin when it matches:
**on a node, all unserved handouts of one size want the same card(s).** Then any
of them is a right answer for an Allocate of that size and no container can get
another's card, whatever the pods' shapes (several containers, init containers,
several cards) and whatever order the kubelet admits them in. A placement that
would break the rule waits until the plugin has served the earlier handout.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .annotations import ContainerShare
from .demand import container_amount
from .objects import PodObject


@dataclass(frozen=True, order=True)
class Handout:
    """One container's Allocate: ``size`` devices, from ``cards`` (UUIDs, in card order)."""

    container: str
    size: int
    cards: tuple[str, ...]


def handouts(containers: Iterable[ContainerShare]) -> list[Handout]:
    """A pod's handouts from its per-container shares (a container may hold shares of several cards)."""
    sizes: dict[str, int] = {}
    cards: dict[str, list[str]] = {}
    for share in containers:
        sizes[share.container] = sizes.get(share.container, 0) + share.units
        cards.setdefault(share.container, []).append(share.uuid)
    return [Handout(name, sizes[name], tuple(cards[name])) for name in sizes]


def count_handouts(pod: PodObject, cards: Sequence[str], resource: str) -> list[Handout]:
    """Handouts of whole cards: what the Allocate of each container asking ``resource``
    (``aliyun.com/gpu-count``) will be, ``size`` = its cards, out of the pod's ``cards``.

    The pod holds as many cards as it asks under the init-container rule (see
    :mod:`.demand`); they are dealt in card order the way the kubelet deals devices:
    restartable sidecars and app containers each take the next cards, an init container
    that runs to completion takes the cards after the sidecars started before it (the app
    containers reuse them once it has ended).
    """
    out: list[Handout] = []
    sidecars = 0
    for c in pod.init_containers:
        n = container_amount(c, resource, f"pod {pod.key} init container {c.name} {resource}")
        if n:
            out.append(Handout(c.name, n, tuple(cards[sidecars : sidecars + n])))
            if c.restart_policy == "Always":
                sidecars += n
    nxt = sidecars
    for c in pod.containers:
        n = container_amount(c, resource, f"pod {pod.key} container {c.name} {resource}")
        if n:
            out.append(Handout(c.name, n, tuple(cards[nxt : nxt + n])))
            nxt += n
    return [h for h in out if len(h.cards) == h.size]  # a record with fewer cards is not ours to serve


def waiting_by_size(pending: Iterable[Iterable[Handout]]) -> dict[int, set[tuple[str, ...]]]:
    """Size -> the card sets that unserved handouts of that size want (one set when the rule holds)."""
    out: dict[int, set[tuple[str, ...]]] = {}
    for pod in pending:
        for h in pod:
            out.setdefault(h.size, set()).add(h.cards)
    return out


def first_conflict(
    new: Iterable[Handout], waiting: Mapping[int, set[tuple[str, ...]]]
) -> tuple[Handout, tuple[str, ...]] | None:
    """The first new handout whose size is already waiting on other card(s), with those cards."""
    for h in new:
        for cards in sorted(waiting.get(h.size, ())):
            if cards != h.cards:
                return h, cards
    return None
