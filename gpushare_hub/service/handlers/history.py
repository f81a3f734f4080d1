"""``api/v1/history``: every slice held, as JSON or CSV, for capacity planning (admin scope)."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from tornado import web

from gpushare_hub.core.history import WAITED_AFTER, history_rows, to_csv

from .base import ADMIN, BaseHandler, requires

log = logging.getLogger("gpushare.service")
# The query's choices (since and until are times).
HISTORY_QUERY = {"format": ("json", "csv"), "names": ("pseudonyms", "real")}


class HistoryHandler(BaseHandler):
    """``GET api/v1/history`` (admin scope): every slice held, for capacity planning."""

    @requires(ADMIN, "Reading the hub's history of slices held")
    def get(self) -> None:
        query = self._query()
        book = self.service.book
        now = time.time()
        since = query.get("since", now - self.service.enforcement.keep_seconds)
        until = query.get("until", now + 1)
        real = query.get("names") == "real"
        if since >= until:
            raise web.HTTPError(400, "since is not before until: give a range that is not empty")
        held = book.intervals(float(since), float(until))
        if real:
            rows = history_rows(held, now)
        else:
            rows = history_rows(held, now, book.pseudonym, book.server_pseudonym)
        if real:
            log.info(
                "%s exported the history of slices held with real user names", self.current_user.get("name")
            )
        if query.get("format") == "csv":
            self.set_header("Content-Type", "text/csv; charset=UTF-8")
            self.set_header("Content-Disposition", 'attachment; filename="gpushare-history.csv"')
            self.set_header("Cache-Control", "no-store")
            self.finish(to_csv(rows))
            return
        self.send(
            {
                "version": "v1",
                "generated": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "names": "real" if real else "pseudonyms",
                "retention_days": round(self.service.enforcement.keep_seconds / 86400),
                "waited_after_seconds": WAITED_AFTER,
                "rows": rows,
            }
        )

    def _query(self) -> dict[str, Any]:
        """``format`` (json, csv), ``names`` (pseudonyms, real), ``since`` and ``until``."""
        return self.query_args(HISTORY_QUERY, ("since", "until"))


handlers = [("api/v1/history", HistoryHandler)]
