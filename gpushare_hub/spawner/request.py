"""The spawn request checked: ``user_options`` bounded when JupyterHub sets them, then
``load_user_options``: the options, a slice that can never fit, the quota, the budget, and
``when_unavailable``; each refusal a :class:`SpawnRefused`."""

from __future__ import annotations

from typing import Any

from traitlets import validate

from gpushare_hub.core.availability import render as render_availability
from gpushare_hub.core.budget import refusal

from .form import SpawnForm
from .options import Reason, Refused, check_options, check_quota, options_problem, quota_for
from .refused import SpawnRefused


class SpawnRequest(SpawnForm):
    """What a spawn may take; the chosen slice is kept in ``gpushare_slice`` and ``gpushare_gib``."""

    @validate("user_options")
    def _bounded_user_options(self, proposal: Any) -> Any:
        """JupyterHub sets ``user_options`` from the request before any spawner code runs, and
        every server model it answers with holds them (``GET /hub/api/users``, which the hub
        service polls): options nested too deep to encode would make those answers fail with a
        500 for as long as the spawn is pending. Keep ``{}`` instead and remember why;
        :meth:`load_user_options` refuses the spawn with that reason (a 400)."""
        value = proposal["value"]
        self._options_problem = options_problem(value) if value is not None else None
        return {} if self._options_problem else value

    async def load_user_options(self) -> None:
        """Check ``user_options`` (untrusted) and apply the chosen profile and slice."""
        problem = getattr(self, "_options_problem", None)
        if problem:  # the options were too deep or too heavy to keep (_bounded_user_options)
            raise SpawnRefused(Refused(Reason.MALFORMED, problem, 'send {"profile": "<slug>"}'))
        await self.ensure_ledger()
        profiles, catalogue = await self._profiles()
        initialised = self._get_initialized_profile_list(profiles)
        outcome = check_options(self.user_options, initialised, catalogue, self._group_names())
        if isinstance(outcome, Refused):
            raise SpawnRefused(outcome)
        if initialised:
            self._load_profile(outcome.profile, initialised)
        chosen = outcome.slice
        self.gpushare_slice, self.gpushare_gib, self._gpushare_chosen = None, 0, None
        if chosen is None:
            return
        # A slice no card here can ever hold is refused for that reason first: a larger quota
        # would not help, so naming the quota would send the user the wrong way.
        a = self.availability_of(chosen)
        if a is not None and a.permanent:
            raise SpawnRefused(
                Refused(
                    Reason.NEVER_FITS,
                    f"{chosen.display_name} cannot start: {render_availability(a)}",
                    "choose a smaller slice, or ask an admin to add such a card",
                )
            )
        gib = chosen.quota_gib(self.resource_names)
        limit = quota_for(self.quota_gib_per_user, self.quota_gib_per_group, self._group_names())
        over = check_quota(chosen, gib, limit, self._holdings())
        if over is not None:
            raise SpawnRefused(over)
        budget = self._budget()
        if budget is not None and budget.spent:
            detail, _, fix = refusal(budget, self._budget_zone()).partition("; ")
            raise SpawnRefused(Refused(Reason.BUDGET, detail, fix))
        if a is not None and not a.placeable and self.when_unavailable == "refuse":
            raise SpawnRefused(
                Refused(
                    Reason.UNAVAILABLE,
                    f"{chosen.display_name} cannot start now: {render_availability(a)}",
                    "choose a smaller slice or try again when someone stops a server",
                )
            )
        self.gpushare_slice, self.gpushare_gib = chosen.slug, gib
        self._gpushare_chosen = chosen
