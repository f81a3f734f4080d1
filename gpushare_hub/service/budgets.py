"""GiB-hour budgets, the service's side: each user's numbers, and the policy for budgets spent.

The book counts what every user held (:mod:`gpushare_hub.accounting.intervals`; the service
records each pass's slices first). :class:`BudgetPolicy` reads it: a user still holding slices
with their budget spent is in the ``warn`` phase (an event on each of their GPU pods, a line in
the log, ``budget.overrun`` in ``api/v1/me``), and ``budget_grace_seconds`` later ``due``: the
:class:`~gpushare_hub.service.enforcer.Enforcer` stops their GPU servers, or parks them on the
CPU-only profile, as ``budget_action`` says ("notify": only the warning). An admin's addition
that leaves the budget unspent withdraws the warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import Any

from gpushare_hub.accounting.book import Book
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

from .enforcer import DUE, RETURNED, WARN, WARNED, Case, Reasons
from .held import HeldSlice

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


class BudgetPolicy:
    """Each user's budget, the admins' view of all of them, and the phase of a spent one."""

    reasons = Reasons(BUDGET_SPENT_REASON, BUDGET_SPENT_REASON, BUDGET_RETURNED_REASON)
    setting = "budget_action"
    warning_logged = True

    def __init__(self, rule: BudgetRule, book: Book, clock: Callable[[], float] = time.time) -> None:
        self.rule = rule
        self.book = book
        self.park_profile = rule.park_profile
        self.clock = clock

    @property
    def tz(self) -> tzinfo:
        return self.rule.tz or UTC

    def window(self, now: float) -> tuple[float, float]:
        return window_bounds(now, self.rule.window, self.tz)

    def budget(self, user: str, groups: Iterable[str], now: float | None = None) -> Budget | None:
        """``user``'s budget in the current window (None: they have none)."""
        limit = self.rule.limit(groups)
        if limit is None:
            return None
        now = self.clock() if now is None else now
        return self.book.budget(user, limit, self.rule.window, self.tz, now)

    def overrun(self, user: str, budget: Budget) -> Overrun | None:
        """The warning already given about ``user``'s spent budget, if any."""
        if not budget.spent:
            return None
        warned = self.book.budget_done(user, budget.start).get(WARNED)
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

    # ---- the phase of a spent budget ----------------------------------------------------------
    def cases(self, held: Sequence[HeldSlice], groups: Mapping[str, list[str]], now: float) -> list[Case]:
        """Users holding slices with their budget spent: ``warn`` until they were told, ``due``
        once the grace is over (``stop`` and ``park`` only). A warning that no longer stands (an
        admin added to the window) is withdrawn here."""
        if not self.rule.configured:
            return []
        by_user: dict[str, list[HeldSlice]] = {}
        for s in held:
            if s.user:
                by_user.setdefault(s.user, []).append(s)
        out = []
        for user, mine in sorted(by_user.items()):
            budget = self.budget(user, groups.get(user, []), now)
            if budget is None:
                continue
            done = self.book.budget_done(user, budget.start)
            if now - done.get(RETURNED, float("-inf")) < RETURN_SETTLE_SECONDS:
                continue  # servers just stopped: their pods may still be going
            over = self.overrun(user, budget)
            if over is None:
                if done.get(WARNED) is not None:
                    self.book.forget_budget(WARNED, user, budget.start)
                    log.info(
                        "%s's GPU budget is no longer spent (%s): warning withdrawn",
                        user,
                        budget.used_words(),
                    )
                continue
            phase = over.phase(now)
            if phase == "warn":
                words = self._warning(budget, now)
            elif phase == "due" and self.rule.action in (STOP, PARK):
                words = f"GPU budget spent ({budget.used_words()}): slice returned"
            else:
                continue
            out.append(
                Case(
                    user=user,
                    servers=tuple(sorted({s.server for s in mine})),
                    pods=tuple(dict.fromkeys((s.namespace, s.pod) for s in mine)),
                    phase=WARN if phase == "warn" else DUE,
                    action=self.rule.action,
                    words=words,
                    numbers=f"GPU budget of {user} spent ({self._numbers(budget, mine)})",
                    done=frozenset(),
                    subject=budget,
                )
            )
        return out

    def record(self, case: Case, what: str, now: float, stopped: bool = True) -> None:
        """``warned`` once per window; ``returned`` again at each return (none is tried again for
        RETURN_SETTLE_SECONDS: a hub that refused is asked again then). Once all the servers were
        stopped, a fresh overrun later in the window (after an addition) is warned again."""
        budget: Budget = case.subject
        if what == WARNED:
            self.book.record_budget(case.user, budget.start, WARNED, now, budget.used_words())
            return
        if stopped:
            self.book.forget_budget(WARNED, case.user, budget.start)
        self.book.forget_budget(RETURNED, case.user, budget.start)
        self.book.record_budget(case.user, budget.start, RETURNED, now, self.rule.action)

    def _warning(self, budget: Budget, now: float) -> str:
        spent = (
            f"Your GPU budget is spent ({budget.used_words()}); it resets {reset_words(budget.end, self.tz)}."
        )
        if self.rule.action == NOTIFY:
            return spent
        when = datetime.fromtimestamp(now + self.rule.grace, self.tz).strftime("%H:%M %Z")
        what = "stopped" if self.rule.action == STOP else "restarted without a GPU (your files stay)"
        return f"{spent} Your servers with a GPU are {what} at {when} unless an admin adds GiB·h."

    def _numbers(self, budget: Budget, mine: list[HeldSlice]) -> str:
        pods = ", ".join(f"{s.key} ({s.units} GiB)" for s in mine)
        return (
            f"{budget.used:.2f} GiB·h used of {budget.limit:g} + {budget.added:g} added in the "
            f"{budget.window} from {iso(budget.start, self.tz)}; holding {pods}; "
            f"rule: {self.rule.action} after {self.rule.grace:.0f} s"
        )

    # ---- the admins' view ----------------------------------------------------------------------
    def booked_users(self, now: float | None = None) -> set[str]:
        """Users who held a slice, or were given GiB·h, in the current window."""
        now = self.clock() if now is None else now
        start, end = self.window(now)
        return {h.user for h in self.book.intervals(start, end)} | set(self.book.added_by_user(start))

    def everyone(self, groups: Mapping[str, list[str]], now: float | None = None) -> dict[str, Any]:
        """``api/v1/budgets``: every user who has a budget and is known to the hub or used some
        this window, with their numbers."""
        now = self.clock() if now is None else now
        start, end = self.window(now)
        used = self.book.used_by_user(start, end, now)
        added = self.book.added_by_user(start)
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
