"""``api/v1/budgets`` (every user's GiB·h in the current window) and ``api/v1/budgets/<user>``
(an admin adds to a user's window); the numbers are :mod:`gpushare_hub.service.budgets`'."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

from tornado import web

from ..hubapi import HubAPI
from ..sources import HubServers
from .base import ADMIN, BaseHandler, RunningService, requires

log = logging.getLogger("gpushare.service")
# The most one addition may add to a user's window (GiB·h).
MAX_ADD_GIB_HOURS = 1_000_000.0


async def budget_groups(svc: RunningService, hub: HubServers) -> dict[str, list[str]]:
    """The groups of every user the budgets' view lists: those with an active server (the last
    poll), and those in this window's book without one (read from the hub, cached)."""
    groups = dict(hub.groups)
    for user in svc.budgets.booked_users():
        if user not in groups:
            groups[user] = await hub.groups_of(user)
    return groups


class BudgetsHandler(BaseHandler):
    """``GET api/v1/budgets`` (admin scope): every user's GiB·h in the current window."""

    @requires(ADMIN, "Reading every user's GPU budget")
    async def get(self) -> None:
        self.filters(())
        self.send(self.service.budgets.everyone(await budget_groups(self.service, self.hub)))


class BudgetAddHandler(BaseHandler):
    """``POST api/v1/budgets/<user>`` ``{"add_gib_hours": 20}`` (admin scope): add to a hub
    user's current window."""

    @requires(ADMIN, "Adding to a user's GPU budget")
    async def post(self, quoted: str) -> None:
        admin = self.current_user
        self.filters(())
        svc = self.service
        if not svc.budget_rule.configured:
            raise web.HTTPError(
                409,
                "no GiB·h budgets are set (c.GPUShareSpawner.quota_gib_hours or its _per_group): "
                "nothing to add to",
            )
        amount = self._amount()
        user = quoted  # tornado has decoded the path's %-escapes once already
        groups = await self._groups(user)
        keeper = svc.budgets
        now = time.time()
        budget = keeper.budget(user, groups, now)
        if budget is None:
            raise web.HTTPError(
                409, f"{user} has no GiB·h budget (none of their groups has one): nothing to add to"
            )
        svc.book.add(user, budget.start, amount, str(admin.get("name")), now)
        log.info(
            "%s added %g GiB·h to %s's GPU budget for the %s from %s",
            admin.get("name"),
            amount,
            user,
            budget.window,
            datetime.fromtimestamp(budget.start, UTC).isoformat(),
        )
        self.send({"user": user, "added": amount, "budget": keeper.document(user, groups, now)})

    def _amount(self) -> float:
        body = self.json_body('{"add_gib_hours": 20}', b"null")
        if not isinstance(body, dict) or set(body) != {"add_gib_hours"}:
            raise web.HTTPError(400, 'send a JSON object with only "add_gib_hours" (GiB·h to add, e.g. 20)')
        amount = body["add_gib_hours"]
        if (
            isinstance(amount, bool)
            or not isinstance(amount, int | float)
            or not 0 < amount <= MAX_ADD_GIB_HOURS  # NaN fails this too
        ):
            raise web.HTTPError(
                400, f'"add_gib_hours" must be a number above 0 and at most {MAX_ADD_GIB_HOURS:.0f}, e.g. 20'
            )
        return float(amount)

    async def _groups(self, user: str) -> list[str]:
        """The hub user's groups, read from the hub now (404 for a name the hub does not know)."""
        if len(user) > 255:
            raise web.HTTPError(404, "no such hub user: a user name has at most 255 characters")
        try:
            status, model = await HubAPI(self.hub.api_url, self.hub.token).user(user)
        except Exception as err:  # the hub restarting, a timeout
            raise web.HTTPError(
                503, f"cannot read {user!r}'s groups from the hub ({err}); try again"
            ) from None
        if status == 404:
            raise web.HTTPError(404, f"no hub user {user!r}: add to the budget of a user the hub knows")
        if status != 200 or not isinstance(model, dict):
            raise web.HTTPError(503, f"cannot read {user!r}'s groups from the hub (HTTP {status}); try again")
        return [str(g) for g in model.get("groups") or []]


handlers = [("api/v1/budgets", BudgetsHandler), ("api/v1/budgets/([^/]+)", BudgetAddHandler)]
