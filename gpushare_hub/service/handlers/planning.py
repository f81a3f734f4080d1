"""``api/v1/planning``: the hub's history replayed against other card counts, catalogues and
policies (:mod:`gpushare_hub.service.planning` does the work; admin scope)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from tornado import web

from gpushare_hub.core.planning import PlanningError

from ..planning import catalogue_sizes, cluster_shape, plan_from_history, plans_for
from .base import ADMIN, BaseHandler, requires

# The query's texts (since and until are times), read by planning.plans_for.
PLANNING_TEXTS = ("cards", "catalogue", "policy")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PlanningHandler(BaseHandler):
    """``GET api/v1/planning`` (admin scope): the hub's history replayed against other card
    counts, catalogues and policies (:mod:`gpushare_hub.service.planning`), on request."""

    @requires(ADMIN, "Planning from the hub's history")
    async def get(self) -> None:
        query = self.query_args({}, ("since", "until"), PLANNING_TEXTS)
        svc = self.service
        now = time.time()
        since = query.get("since", now - svc.enforcement.keep_seconds)
        until = query.get("until", now + 1)
        if since >= until:
            raise web.HTTPError(400, "since is not before until: give a range that is not empty")
        shape = cluster_shape(self.cluster.ledger())
        sizes = catalogue_sizes(svc.catalogue, shape.mib // 1024)
        try:  # every parameter read and bounded before anything is built
            plans = plans_for({k: query[k] for k in PLANNING_TEXTS if k in query}, shape, sizes)
        except PlanningError as err:
            raise web.HTTPError(400, str(err)) from None
        if svc.planning_lock.locked():
            raise web.HTTPError(429, "another plan is being computed; try again when it is done")
        async with svc.planning_lock:  # the history is read and replayed in the worker only
            started = time.perf_counter()
            loop = asyncio.get_running_loop()
            try:
                sessions, doc = await loop.run_in_executor(
                    None, plan_from_history, svc.book, since, until, now, plans
                )
            except PlanningError as err:
                raise web.HTTPError(400, str(err)) from None
        if doc is None:
            raise web.HTTPError(
                404,
                f"no slice was held between {_iso(since)} and {_iso(min(until, now))}: the plan replays "
                "the hub's history, which starts when the service first sees a GPU notebook",
            )
        self.send(
            {
                "version": "v1",
                "generated": _iso(now),
                "since": _iso(max(since, min(s.arrive for s in sessions))),
                "until": _iso(min(until, now)),
                "cluster": {
                    "cards": shape.cards,
                    "model": shape.model,
                    "card_gib": shape.mib // 1024,
                    "cards_per_node": shape.per_node,
                },
                "catalogue": list(sizes),
                **doc,
                "seconds": round(time.perf_counter() - started, 2),
            }
        )


handlers = [("api/v1/planning", PlanningHandler)]
