"""GiB-hour budgets, the service's side: keep the book, and act on budgets spent.

Every pass (``gpu_idle_check_seconds``, on fresh figures only) :class:`BudgetKeeper` records the
slices held now, from the ledger document (one interval per pod placement: the pod's
``since``, which the API server holds, to the pass that no longer sees it; see
:mod:`gpushare_hub.accounting.store`). A user still holding slices with their budget spent is
warned (an event on each of their GPU pods, a line in the log, ``budget.overrun`` in
``api/v1/me``), and ``budget_grace_seconds`` later their GPU servers are stopped, or parked on
the CPU-only profile, as ``budget_action`` says ("notify": only the warning). An admin's
addition that leaves the budget unspent withdraws the warning.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any

from gpushare_hub.accounting.store import KEEP_SECONDS, BudgetStore
from gpushare_hub.core.budget import (
    NOTIFY,
    PARK,
    STOP,
    Budget,
    Overrun,
    iso,
    limit_for,
    reset_words,
    window_bounds,
)
from gpushare_hub.core.names import BUDGET_RETURNED_REASON, BUDGET_SPENT_REASON

from .held import held_now
from .returner import EventPoster, HubAPI, start_when_stopped, stop_server

log = logging.getLogger("gpushare.service.budgets")

# After a user's servers were stopped for a spent budget, their pods may take a while to go:
# no new warning for them meanwhile.
RETURN_SETTLE_SECONDS = 300.0


@dataclass(frozen=True)
class BudgetRule:
    """The budgets' settings (the spawner's ``quota_gib_hours*`` and the service's own)."""

    per_user: float | None = None
    per_group: Mapping[str, float] = field(default_factory=dict)
    window: str = "week"
    tz: tzinfo | None = None
    grace: float = 900.0
    action: str = NOTIFY
    park_profile: str = ""

    @property
    def configured(self) -> bool:
        return self.per_user is not None or bool(self.per_group)

    def limit(self, groups: Iterable[str]) -> float | None:
        return limit_for(self.per_user, self.per_group, groups)


class BudgetKeeper:
    def __init__(
        self,
        rule: BudgetRule,
        store: BudgetStore,
        hub: HubAPI | None = None,
        post_event: EventPoster | None = None,
        clock: Callable[[], float] = time.time,
        gap: float = 90.0,
        keep_seconds: float = KEEP_SECONDS,
    ) -> None:
        self.rule = rule
        self.store = store
        self.hub = hub
        self.post_event = post_event
        self.clock = clock
        self.gap = gap
        self.keep_seconds = max(keep_seconds, KEEP_SECONDS)  # budgets need the last month
        self._acting: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._last_prune = 0.0

    @property
    def tz(self) -> tzinfo:
        from datetime import UTC

        return self.rule.tz or UTC

    def window(self, now: float) -> tuple[float, float]:
        return window_bounds(now, self.rule.window, self.tz)

    def budget(self, user: str, groups: Iterable[str], now: float | None = None) -> Budget | None:
        """``user``'s budget in the current window (None: they have none)."""
        limit = self.rule.limit(groups)
        if limit is None:
            return None
        now = self.clock() if now is None else now
        return self.store.budget(user, limit, self.rule.window, self.tz, now)

    def overrun(self, user: str, budget: Budget) -> Overrun | None:
        """The warning already given about ``user``'s spent budget, if any."""
        if not budget.spent:
            return None
        warned = self.store.actions(user, budget.start).get("warned")
        return Overrun(user, budget, warned, self.rule.grace)

    def document(self, user: str, groups: Iterable[str], now: float | None = None) -> dict[str, Any] | None:
        """``api/v1/me``'s ``budget``: the numbers, and what happens when it is spent."""
        now = self.clock() if now is None else now
        budget = self.budget(user, groups, now)
        if budget is None:
            return None
        doc: dict[str, Any] = budget.document(self.tz)
        doc["resets_words"] = reset_words(budget.end, self.tz)
        doc["words"] = budget.used_words()
        over = self.overrun(user, budget)
        if over is not None and over.warned_at is not None and over.due_at is not None:
            doc["overrun"] = {
                "action": self.rule.action,
                "warned_at": iso(over.warned_at, self.tz),
                "due_at": iso(over.due_at, self.tz) if self.rule.action != NOTIFY else None,
            }
        return doc

    # ---- the pass ------------------------------------------------------------------------------
    async def tick(
        self,
        allocations: list[Mapping[str, Any]],
        groups: Mapping[str, list[str]],
        models: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Record what is held now, then warn or act on spent budgets; the users acted on."""
        now = self.clock()
        held = held_now(allocations, now, models, groups)
        self.store.observe(held, now, self.gap)
        if now - self._last_prune > 3600:
            self.store.forget_before(now - self.keep_seconds)
            self._last_prune = now
        if not self.rule.configured:
            return []
        acted = []
        by_user: dict[str, list[Mapping[str, Any]]] = {}
        for a in allocations:
            if a.get("hub_user"):
                by_user.setdefault(str(a["hub_user"]), []).append(a)
        for user, mine in sorted(by_user.items()):
            budget = self.budget(user, groups.get(user, []), now)
            if budget is None:
                continue
            done = self.store.actions(user, budget.start)
            if now - done.get("returned", float("-inf")) < RETURN_SETTLE_SECONDS:
                continue  # servers just stopped: their pods may still be going
            over = self.overrun(user, budget)
            if over is None:
                # Not spent (an admin added to it): a warning given earlier no longer stands.
                if done.get("warned") is not None:
                    self.store.forget("warned", user, budget.start)
                    log.info(
                        "%s's GPU budget is no longer spent (%s): warning withdrawn",
                        user,
                        budget.used_words(),
                    )
                continue
            phase = over.phase(now)
            if phase == "warn":
                self.store.record(user, budget.start, "warned", now, budget.used_words())
                words = self._warning(budget, now)
                log.warning("GPU budget of %s spent (%s): %s", user, self._numbers(budget, mine), words)
                await self._events(mine, BUDGET_SPENT_REASON, words)
                acted.append(user)
            elif phase == "due" and self.rule.action in (STOP, PARK) and user not in self._acting:
                self._acting.add(user)
                task = asyncio.get_running_loop().create_task(self._return(user, budget, mine))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                acted.append(user)
        return acted

    def _warning(self, budget: Budget, now: float) -> str:
        spent = (
            f"Your GPU budget is spent ({budget.used_words()}); it resets {reset_words(budget.end, self.tz)}."
        )
        if self.rule.action == NOTIFY:
            return spent
        when = datetime.fromtimestamp(now + self.rule.grace, self.tz).strftime("%H:%M %Z")
        what = "stopped" if self.rule.action == STOP else "restarted without a GPU (your files stay)"
        return f"{spent} Your servers with a GPU are {what} at {when} unless an admin adds GiB·h."

    def _numbers(self, budget: Budget, mine: list[Mapping[str, Any]]) -> str:
        pods = ", ".join(f"{a['namespace']}/{a['pod']} ({a['units']} GiB)" for a in mine)
        return (
            f"{budget.used:.2f} GiB·h used of {budget.limit:g} + {budget.added:g} added in the "
            f"{budget.window} from {iso(budget.start, self.tz)}; holding {pods}; "
            f"rule: {self.rule.action} after {self.rule.grace:.0f} s"
        )

    async def _events(self, mine: list[Mapping[str, Any]], reason: str, message: str) -> None:
        if self.post_event is None:
            return
        for a in {(a["namespace"], a["pod"]): a for a in mine}.values():
            try:
                await self.post_event(a["namespace"], a["pod"], reason, message)
            except Exception as err:
                log.warning(
                    "cannot post the %s event on pod %s/%s: %s", reason, a["namespace"], a["pod"], err
                )

    async def _return(self, user: str, budget: Budget, mine: list[Mapping[str, Any]]) -> None:
        try:
            servers = sorted({str(a.get("server") or "") for a in mine})
            log.warning(
                "GPU budget of %s spent and the grace of %.0f s over (%s): %s server(s) %s",
                user,
                self.rule.grace,
                self._numbers(budget, mine),
                "parking" if self.rule.action == PARK else "stopping",
                ", ".join(repr(s) for s in servers),
            )
            await self._events(
                mine, BUDGET_RETURNED_REASON, f"GPU budget spent ({budget.used_words()}): slice returned"
            )
            stopped = [await self._return_server(user, server) for server in servers]
            if all(stopped):
                # A fresh overrun later in the window (after an addition) is warned again.
                self.store.forget("warned", user, budget.start)
            # Not tried again for RETURN_SETTLE_SECONDS (a hub that refused is asked again then).
            self.store.forget("returned", user, budget.start)
            self.store.record(user, budget.start, "returned", self.clock(), self.rule.action)
        finally:
            self._acting.discard(user)

    async def _return_server(self, user: str, server: str) -> bool:
        """Stop (and for park, start again on the CPU profile) one server; False when the hub
        refused to stop it."""
        if self.hub is None or not await stop_server(self.hub, user, server, "budget_action"):
            return False
        if self.rule.action == PARK:
            await start_when_stopped(self.hub, user, server, {"profile": self.rule.park_profile}, 300)
        return True

    # ---- the admins' view ----------------------------------------------------------------------
    def booked_users(self, now: float | None = None) -> set[str]:
        """Users who held a slice, or were given GiB·h, in the current window."""
        now = self.clock() if now is None else now
        start, end = self.window(now)
        return {h.user for h in self.store.intervals(start, end)} | set(self.store.added_by_user(start))

    def everyone(self, groups: Mapping[str, list[str]], now: float | None = None) -> dict[str, Any]:
        """``api/v1/budgets``: every user who has a budget and is known to the hub or used some
        this window, with their numbers."""
        now = self.clock() if now is None else now
        start, end = self.window(now)
        used = self.store.used_by_user(start, end, now)
        added = self.store.added_by_user(start)
        users = []
        for user in sorted(set(groups) | set(used) | set(added)):
            limit = self.rule.limit(groups.get(user, []))
            if limit is None:
                continue
            b = Budget(self.rule.window, start, end, limit, used.get(user, 0.0), added.get(user, 0.0))
            users.append({"user": user, **b.document(self.tz), "words": b.used_words()})
        return {
            "configured": self.rule.configured,
            "window": self.rule.window,
            "window_start": iso(start, self.tz),
            "resets_at": iso(end, self.tz),
            "resets_words": reset_words(end, self.tz),
            "users": users,
        }
