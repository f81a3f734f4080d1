"""Idle slices come back: what happens to each slice idle on the GPU, and when. Pure.

The device plugin publishes since when each pod has been idle on its card (``idleSince``, see
:mod:`gpushare_hub.isolation.usage`); each :class:`~gpushare_hub.service.held.HeldSlice`
carries it as ``idle_since``. Here an :class:`IdleRule` (the service's settings) turns that into an
:class:`IdleState` per slice: the action that applies (``notify``, ``hibernate``, ``stop`` or
``park``; ``auto``, the default, is ``hibernate`` on a node whose driver can hibernate kernels and
``notify`` elsewhere), the deadline, and the words the user reads. Nothing here acts: the service does
(:mod:`gpushare_hub.service.idlepolicy` and :mod:`gpushare_hub.service.enforcer`).

``hibernate`` is not the service's to do: the notebook server's extension checkpoints each kernel
that ran nothing for ``return_after`` seconds (its GPU memory copied to the pod's host memory,
the card's memory given back) and restores it when the next cell runs. The service only tells it
so (``hibernate_after`` on each allocation of ``api/v1/me``, :meth:`IdleRule.hibernate_after`),
and never warns about, stops or parks such a slice.

An *idle stretch* is one run of idleness of one server's pod, named by the pod's card
assignment time (``since``) and the idle clock's start: any GPU work ends it, and Keep
postpones a stretch once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare_hub.core.budget import NOTIFY as NOTIFY
from gpushare_hub.core.budget import PARK as PARK
from gpushare_hub.core.budget import STOP as STOP
from gpushare_hub.core.durations import duration_words

from .held import HeldSlice
from .hubservers import rfc3339

NONE = "none"  # an idle slice of these users or slices is left alone
HIBERNATE = "hibernate"  # the notebook hibernates its idle kernels; the server keeps running
AUTO = "auto"  # hibernate where the slice's node can (its plugin says so), else notify
ACTIONS = (NONE, NOTIFY, HIBERNATE, STOP, PARK, AUTO)
# Where a user's groups ask different actions, the mildest applies: a group is a grant.
MILDNESS = {NONE: 0, NOTIFY: 1, HIBERNATE: 2, PARK: 3, STOP: 4}

# Phases of a slice idle on the GPU.
IDLE, WARNING, DUE = "idle", "warning", "due"


@dataclass(frozen=True)
class IdleRule:
    """The service's idle settings (``GPUShareService.gpu_idle_*``)."""

    action: str = AUTO
    per_group: Mapping[str, str] = field(default_factory=dict)
    per_slice: Mapping[str, str] = field(default_factory=dict)
    exempt_groups: Collection[str] = ()
    return_after: int = 7200  # seconds idle before the action
    warn_before: int = 600  # the warning shows this long before
    keep_seconds: int = 3600  # Keep postpones the deadline to this long after it is pressed
    park_profile: str = ""

    def action_for(self, groups: Iterable[str], slice_slug: str, checkpoint: bool = False) -> str:
        """Exempt groups first, then the slice's action, then the mildest of the user's groups'
        actions, then the default. ``auto`` is ``hibernate`` where the slice's node can
        (``checkpoint``: its plugin says its driver can), else ``notify``."""
        groups = list(groups)
        if any(g in self.exempt_groups for g in groups):
            return NONE

        def resolved(action: str) -> str:
            return (HIBERNATE if checkpoint else NOTIFY) if action == AUTO else action

        if slice_slug in self.per_slice:
            return resolved(self.per_slice[slice_slug])
        asked = [resolved(self.per_group[g]) for g in groups if g in self.per_group]
        return min(asked, key=MILDNESS.__getitem__) if asked else resolved(self.action)

    def hibernate_after(self, groups: Iterable[str], slice_slug: str, checkpoint: bool = False) -> int | None:
        """Seconds a kernel may run nothing before the notebook hibernates it, where the action
        for ``groups`` and ``slice_slug`` (on a node that can, or not) is ``hibernate``; else None
        (``api/v1/me``'s ``hibernate_after``)."""
        hibernates = self.action_for(groups, slice_slug, checkpoint) == HIBERNATE
        return self.return_after if hibernates else None


@dataclass(frozen=True)
class IdleState:
    """One slice idle on the GPU and what is coming to it."""

    user: str
    server: str
    namespace: str
    pod: str
    slice: str
    units: int
    idle_seconds: int
    action: str
    deadline: int  # Unix seconds: when the action is due
    stretch: str  # names this idle stretch (see the module docstring)
    kept_until: int | None  # set once Keep was pressed for this stretch
    phase: str
    return_after: int  # the rule's: seconds idle before the action (hibernate: per kernel)

    @property
    def can_keep(self) -> bool:
        return self.kept_until is None and self.action in (STOP, PARK)

    def words(self, now: int) -> str:
        """What the user reads (``api/v1/me``, the notebook's status bar, the Warning event)."""
        idle = duration_words(self.idle_seconds)
        left = duration_words(self.deadline - now)
        if self.action == NOTIFY:
            return (
                f"your GPU slice has been idle for {idle}: nothing has run on it and it holds no "
                "data. Stop your server when you are done, so that someone else can use the card."
            )
        if self.action == HIBERNATE:
            return (
                f"your GPU slice has been idle for {idle}. A kernel that runs nothing for "
                f"{duration_words(self.return_after)} hibernates: its GPU memory goes back to the "
                "card, and the next cell you run wakes it with every variable intact. Your server "
                "keeps running."
            )
        what = (
            "your server restarts without a GPU (your files and image stay)"
            if self.action == PARK
            else "your server stops (your files stay)"
        )
        if self.phase == DUE:
            return f"your GPU slice has been idle for {idle} and is being returned: {what}."
        unless = "unless you use it" + (" or press Keep" if self.can_keep else "")
        kept = " (you pressed Keep once)" if self.kept_until is not None else ""
        return f"your GPU has been idle for {idle}; in {left} it goes back and {what}{kept}, {unless}."

    def to_json(self, now: int) -> dict[str, Any]:
        return {
            "action": self.action,
            "phase": self.phase,
            "idle_seconds": self.idle_seconds,
            "deadline": self.deadline,
            "seconds_left": max(0, self.deadline - now),
            "kept": self.kept_until is not None,
            "can_keep": self.can_keep,
            "words": self.words(now),
        }


def idle_states(
    slices: Iterable[HeldSlice],
    groups: Mapping[str, list[str]],
    rule: IdleRule,
    keeps: Mapping[tuple[str, str, str], int],
    now: int,
) -> list[IdleState]:
    """Each hub user's slice idle on the GPU (``idle_since`` set), with its action and phase.
    ``keeps``: (user, server, stretch) -> until, for the stretches Keep put off. Slices of no hub
    user, and those of exempt groups or with action ``none``, are left out. A ``hibernate``
    slice is never in the warning phase: nobody is warned of what only hibernates kernels."""
    out = []
    for a in slices:
        user, since = a.user, a.idle_since
        if not user or since is None:
            continue
        idle = max(0, now - since)
        action = rule.action_for(groups.get(user, []), a.slice, a.checkpoint)
        if action == NONE:
            continue
        # Named by the card's hand-out time as the API says it: the book's keys across versions.
        stretch = f"{rfc3339(a.since)}/{since}"
        server = a.server
        kept = keeps.get((user, server, stretch))
        deadline = min(since, now) + rule.return_after
        if kept is not None:
            deadline = max(deadline, kept)
        warns = action != HIBERNATE and now >= deadline - rule.warn_before
        phase = DUE if now >= deadline else WARNING if warns else IDLE
        out.append(
            IdleState(
                user=user,
                server=server,
                namespace=a.namespace,
                pod=a.pod,
                slice=a.slice,
                units=a.units,
                idle_seconds=idle,
                action=action,
                deadline=deadline,
                stretch=stretch,
                kept_until=kept,
                phase=phase,
                return_after=rule.return_after,
            )
        )
    return out
