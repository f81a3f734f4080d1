"""GiB-hour budgets and GPU quotas on the spawner's side: the user's groups, their other servers'
slices, and their budget read from the hub service's book (the settings are ``QuotaSettings``)."""

from __future__ import annotations

import time
import zoneinfo
from typing import Any

from traitlets import Float, Unicode

from gpushare_hub.accounting.quotas import QuotaSettings
from gpushare_hub.accounting.zones import budget_zone
from gpushare_hub.core.budget import Budget, limit_for
from gpushare_hub.core.catalogue import CatalogueError

from .options import Holding
from .settings import SliceSettings


class BudgetView(SliceSettings, QuotaSettings):
    """``quota_gib_*``, ``budget_db``: what the user holds and may still use."""

    quota_gib_hours_session = Float(
        8.0,
        min=0.1,
        config=True,
        help="""
        Hours the spawn form prices a slice at: "a 5 GiB slice for 8 h would use 40".
        """,
    )
    budget_db = Unicode(
        "",
        config=True,
        help="""
        The hub service's database (``c.GPUShareService.state_db``), where it counts GiB·h;
        the spawner only reads it. ``configure_hub`` sets it. Needed with ``quota_gib_hours``.
        """,
    )

    _budget_stores: dict[str, Any] = {}  # noqa: RUF012 - one reader per database for the process

    def _budget_zone(self) -> zoneinfo.ZoneInfo:
        return budget_zone(self.quota_gib_hours_timezone)

    def _budget(self, now: float | None = None) -> Budget | None:
        """The user's budget in the current window (None: they have none)."""
        limit = limit_for(self.quota_gib_hours, self.quota_gib_hours_per_group, self._group_names())
        if limit is None:
            return None
        if not self.budget_db:
            raise CatalogueError(
                "quota_gib_hours is set but budget_db is not: the hub service counts GiB·h in its "
                "database; call configure_hub in jupyterhub_config.py (it sets "
                "c.GPUShareSpawner.budget_db), or set budget_db to c.GPUShareService.state_db"
            )
        from gpushare_hub.accounting.book import Book

        stores = type(self)._budget_stores
        if self.budget_db not in stores:
            stores[self.budget_db] = Book(self.budget_db)
        store: Book = stores[self.budget_db]
        now = time.time() if now is None else now
        return store.budget(str(self.user.name), limit, self.quota_gib_hours_window, self._budget_zone(), now)

    def _group_names(self) -> list[str]:
        return [str(g.name) for g in (getattr(self.user, "groups", None) or [])]

    def _holdings(self) -> list[Holding]:
        """The user's other active servers that hold a slice."""
        out = []
        spawners = getattr(self.user, "spawners", None) or {}
        for name, sp in sorted(spawners.items()):
            if sp is self or name == self.name or not getattr(sp, "active", False):
                continue
            slug = getattr(sp, "gpushare_slice", None)
            if slug:
                out.append(Holding(server=name, slug=slug, gib=int(getattr(sp, "gpushare_gib", 0))))
        return out
