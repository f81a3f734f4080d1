"""What hub users hold, as the service reasons about it: :class:`HeldSlice`, one pod's slice on
one card, read once from the report and the hub's servers, with every time as Unix seconds.

The idle rule, the budgets, Keep and ``api/v1/me`` read these rows; the documents of the API
say them in RFC 3339, written once, at the edge (:meth:`HeldSlice.to_json`). Each pass the
book records them as :class:`~gpushare_hub.core.budget.Held` intervals (:func:`held_now`):
one per pod placement, what the GiB·h budgets and the history are made of.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_hub.core.budget import Held
from gpushare_hub.core.reportrows import CardRow, PodRow, Report

from .hubservers import HubServer, idle_seconds, rfc3339, seconds_of


@dataclass(frozen=True)
class HeldSlice:
    """One pod's slice on one card (times: Unix seconds, None where unknown)."""

    namespace: str
    pod: str
    user: str  # the hub user ("" for a pod of no hub user)
    server: str
    units: int
    node: str = ""
    card_uuid: str = ""
    model: str = ""  # the card's model
    slice: str = ""  # the catalogue's slug
    since: float | None = None  # the card was handed out (else the pod started or was made)
    created: float | None = None  # the pod was made
    scheduled: float | None = None  # the pod was bound to its node
    started: float | None = None  # the hub started the server
    last_activity: float | None = None  # the hub last saw activity on the server
    used_mib: int | None = None  # GPU memory its processes hold (None: not measured)
    sm_util: int | None = None
    over_slice: bool = False
    idle_since: int | None = None  # idle on the GPU since (None: working, or not measured)
    hibernated_since: int | None = None  # hibernated since (None: awake, or the node does not overcommit)
    checkpoint: bool = False  # its node's driver can hibernate kernels (the idle action "auto")

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"

    def gpu_idle_seconds(self, now: float) -> int | None:
        """How long the pod has been idle on the GPU; None while it works or is not measured."""
        return None if self.idle_since is None else max(0, int(now) - self.idle_since)

    def to_json(self, now: float, gpu_idle_after: int) -> dict[str, Any]:
        """The allocation as the API says it (``api/v1/ledger``, ``api/v1/me``)."""
        gpu_idle = self.gpu_idle_seconds(now)
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "hub_user": self.user,
            "server": self.server,
            "slice": self.slice,
            "card_uuid": self.card_uuid,
            "units": self.units,
            "since": rfc3339(self.since),
            "created": rfc3339(self.created),
            "scheduled": rfc3339(self.scheduled),
            "started": rfc3339(self.started),
            "last_activity": rfc3339(self.last_activity),
            "idle_seconds": idle_seconds(self.last_activity, now),
            "used_mib": self.used_mib,
            "sm_util": self.sm_util,
            "over_slice": self.over_slice,
            "gpu_idle_seconds": gpu_idle,
            "gpu_idle_since": self.idle_since,
            "gpu_idle": gpu_idle is not None and gpu_idle >= gpu_idle_after,
            "hibernated_since": rfc3339(self.hibernated_since) or None,
        }


def held_slice(
    pod: PodRow, card: CardRow, node: str, hub: Mapping[tuple[str, str], HubServer], checkpoint: bool = False
) -> HeldSlice:
    """``pod``'s slice on ``card``, with its hub server's times (``hub``: by user and server)."""
    srv = hub.get((pod.hub_user, pod.hub_server))
    return HeldSlice(
        namespace=pod.namespace,
        pod=pod.name,
        user=pod.hub_user,
        server=pod.hub_server,
        units=pod.units,
        node=node,
        card_uuid=card.uuid,
        model=card.model,
        slice=pod.slice,
        since=seconds_of(pod.since),
        created=seconds_of(pod.created),
        scheduled=seconds_of(pod.scheduled),
        started=seconds_of(srv.started) if srv else None,
        last_activity=seconds_of(srv.last_activity) if srv else None,
        used_mib=pod.used_mib,
        sm_util=pod.sm_util,
        over_slice=pod.over_slice,
        idle_since=pod.idle_since,
        hibernated_since=pod.hibernated_since,
        checkpoint=checkpoint,
    )


def held_slices(report: Report, servers: Iterable[HubServer], user: str | None = None) -> list[HeldSlice]:
    """Every slice held on the report's cards; ``user``: that hub user's only (``api/v1/me``
    and Keep, on every status bar's poll, read no one else's times)."""
    hub = {(s.user, s.server): s for s in servers if user is None or s.user == user}
    return [
        held_slice(pod, card, node.name, hub, node.isolation.checkpoint)
        for node in report.nodes
        for card in node.cards
        for pod in card.pods
        if user is None or pod.hub_user == user
    ]


def held_now(
    slices: Iterable[HeldSlice], now: float, groups: Mapping[str, list[str]] | None = None
) -> list[Held]:
    """The hub users' slices as the book's intervals: one per pod placement (a pod on several
    cards sums them), with the card model and the user's groups for the history."""
    held: dict[str, Held] = {}
    for s in slices:
        if not s.user:
            continue
        # Held from the bind (the API server's PodScheduled time); else from when the card was
        # handed out, the pod started or was made (``since``).
        start = s.scheduled if s.scheduled is not None else s.since if s.since is not None else now
        key = f"{s.key}@{int(start)}"
        prior = held.get(key)
        held[key] = Held(
            key,
            s.user,
            float(s.units) + (prior.gib if prior else 0.0),
            start,
            None,
            s.server,
            slice=s.slice,
            model=s.model,
            # The spawn's wait (start - created) only where the bind time is known.
            created=s.created if s.scheduled is not None else None,
            groups=tuple((groups or {}).get(s.user, [])),
            measured=s.used_mib is not None or (prior.measured if prior else False),
            idle_since=_idle_since(s, prior),
        )
    return list(held.values())


def _idle_since(s: HeldSlice, prior: Held | None) -> float | None:
    """Since when the pod has been idle on the GPU (a pod on several cards: idle on all of
    them, since the latest); None while it is busy or not measured."""
    mine = float(s.idle_since) if s.idle_since is not None else None
    if prior is None:
        return mine
    if mine is None or prior.idle_since is None:
        return None
    return max(mine, prior.idle_since)
