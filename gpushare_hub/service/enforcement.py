"""The service's pass over fresh figures, every ``gpu_idle_check_seconds``: the book records
what each hub user holds now, then the :class:`~gpushare_hub.service.enforcer.Enforcer` applies
the three policies (idle return, GiB·h budgets, servers over their slices). Built once from the
rules and the book, by the service's ``run`` and by the tests, so both wire it the same way."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from gpushare_hub.accounting.book import KEEP_SECONDS, Book

from .budgets import BudgetPolicy, BudgetRule
from .enforcer import Case, Enforcer, EventPoster, Policy
from .held import HeldSlice, held_now
from .hubapi import HubAPI
from .idle import IdleRule
from .idlepolicy import IdlePolicy
from .overslice import OverSlicePolicy, OverSliceRule

log = logging.getLogger("gpushare.service")

# How often what the book no longer needs is dropped (seconds).
PRUNE_EVERY = 3600.0


class Enforcement:
    """The book, the three policies and the enforcer, and the pass that drives them."""

    def __init__(
        self,
        book: Book,
        idle_rule: IdleRule,
        budget_rule: BudgetRule,
        hub: HubAPI | None,
        post_event: EventPoster | None = None,
        *,
        check_seconds: float = 30.0,
        retention_days: int = 90,
        clock: Callable[[], float] = time.time,
        over_slice: OverSliceRule | None = None,
    ) -> None:
        """``check_seconds``: the pass's period (a pod gone between two passes that far apart
        ended when it was last seen); ``retention_days``: how long the book keeps what ended."""
        self.book = book
        self.idle = IdlePolicy(idle_rule, book)
        self.budgets = BudgetPolicy(budget_rule, book, clock)
        self.over = OverSlicePolicy(over_slice or OverSliceRule())
        self.enforcer = Enforcer(hub, post_event, clock)
        self.clock = clock
        self.gap = max(90.0, 3 * check_seconds)
        self.keep_seconds = max(retention_days * 86400.0, KEEP_SECONDS)
        self._last_prune = float("-inf")

    async def run_pass(self, held: Sequence[HeldSlice], groups: Mapping[str, list[str]]) -> list[Case]:
        """One pass over what is held now (fresh figures); ``groups``: each holder's hub groups.
        The cases acted on."""
        now = self.clock()
        try:
            self.book.observe(held_now(held, now, groups), now, self.gap)
            if now - self._last_prune >= PRUNE_EVERY:
                self.book.forget_before(now - self.keep_seconds)
                self._last_prune = now
        except Exception:
            log.exception("the GiB·h book failed this pass; it runs again next pass")
        acted: list[Case] = []
        policies: tuple[tuple[str, Policy], ...] = (
            ("idle rule", self.idle),
            ("GiB·h budget", self.budgets),
            ("over-slice rule", self.over),
        )
        for name, policy in policies:
            try:
                acted += await self.enforcer.tick(policy, held, groups)
            except Exception:
                log.exception("the %s failed this pass; it runs again next pass", name)
        return acted
