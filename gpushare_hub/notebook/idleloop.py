"""One turn of a notebook server's hibernation loop (:meth:`Hibernator.tick`).

* Kernels that ran nothing for the hub's ``hibernate_after`` hibernate (a kernel kept awake,
  busy, or refused for its current work is left alone); a hibernated kernel that turned busy
  some other way than a cell sent through the websocket is woken.
* On nodes that overcommit their cards, the server tells the node's plugin where it stands
  through its door (:mod:`.door`), and hibernates its idle kernels when the plugin asks for room
  for a neighbour's wake. The plugin asks only where it measured no GPU work for its minimum idle
  time; keep-awake holds against the hub's idle rule, not against that.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from .sleepstate import AWAKE, HIBERNATED, REFUSED, WAITING, WAKING

if TYPE_CHECKING:
    from .hibernator import Hibernator


def _busy(kernel: object) -> bool:
    return getattr(kernel, "execution_state", "") == "busy"


def idle_seconds(kernel: object, now: float) -> float | None:
    """How long the kernel has run nothing (0 while busy; None when Jupyter says nothing)."""
    activity = getattr(kernel, "last_activity", None)
    if not isinstance(activity, datetime):
        return None
    return 0.0 if _busy(kernel) else max(0.0, now - activity.timestamp())


async def tick(hib: Hibernator, after_seconds: int | None) -> None:
    now = hib.clock()
    ids = list(hib.kernels.list_kernel_ids())
    for gone in set(hib.sleeps) - set(ids):
        hib.sleeps.pop(gone, None)
    if hib.door is not None:
        await answer_door(hib, ids, now)
    for kid in ids:
        k = hib.kernel(kid)
        sleep = hib.sleep_of(kid)
        if sleep.state == HIBERNATED and _busy(k):
            hib.wake_soon(kid)
            continue
        if after_seconds is None or _busy(k) or sleep.keep_awake or sleep.state not in (AWAKE, REFUSED):
            continue
        if sleep.state == REFUSED and str(getattr(k, "last_activity", None)) == sleep.refused_activity:
            continue
        idle = idle_seconds(k, now)
        if idle is not None and idle >= after_seconds:
            await hib.hibernate(kid)


async def answer_door(hib: Hibernator, ids: list[str], now: float) -> None:
    """Hibernate the idle kernels when the plugin asks; tell it where the server stands."""
    assert hib.door is not None
    if hib.door.answer().hibernate_now:
        for kid in ids:
            if not _busy(hib.kernel(kid)) and hib.sleep_of(kid).state in (AWAKE, REFUSED):
                await hib.hibernate(kid)
    tell_door(hib, now, ids)


def tell_door(hib: Hibernator, now: float, ids: list[str] | None = None) -> None:
    """Tell the plugin where the server stands, the same way from every caller (the loop, a
    wake), so that the ask changes only when the server's state does: every new ask makes the
    plugin's answer old until it answers again. While a kernel asks to wake the idle time is not
    told (it matters only for choosing neighbours to hibernate among awake servers)."""
    assert hib.door is not None
    ids = list(hib.kernels.list_kernel_ids()) if ids is None else ids
    asleep = any(hib.sleep_of(kid).state in (HIBERNATED, WAITING, WAKING) for kid in ids)
    # A server that landed while its card's awake room was taken starts recorded hibernated: it
    # asks for its slice at once (its first CUDA use without the grant would be caught).
    landed_asleep = not asleep and hib.door.answer().state == "hibernated"
    wake = bool(hib.line) or landed_asleep
    idle = [s for s in (idle_seconds(hib.kernel(kid), now) for kid in ids) if s is not None]
    hib.door.tell(
        hibernated=asleep and not hib.awake_processes(),
        wake=wake,
        idle_seconds=0.0 if wake else min(idle, default=0.0),
    )
