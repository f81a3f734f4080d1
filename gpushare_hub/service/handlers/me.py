"""``api/v1/me`` (the caller's slices, waiting spawns, idle returns and budget: what the
notebook's status bar shows) and ``api/v1/me/keep`` (Keep: put off an idle slice's return)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from jupyterhub.utils import url_path_join  # type: ignore[import-untyped]
from tornado import web

from gpushare_hub.core.catalogue import Catalogue
from gpushare_hub.core.durations import returned_words
from gpushare_hub.core.queue import holds_back
from gpushare_hub.core.releases import ReleaseHistory

from ..held import HeldSlice, held_slices
from ..hubservers import HubServer, rfc3339
from ..idle import HIBERNATE
from ..sources import Cluster
from ..view import availability_document, me_document
from .base import BaseHandler, RunningService, requires

log = logging.getLogger("gpushare.service")


class MeHandler(BaseHandler):
    server_tokens = users_only = True

    @requires()
    async def get(self) -> None:
        user = self.current_user
        self.filters(())
        svc = self.service
        name = str(user.get("name"))
        groups = await self.hub.groups_of(name)
        free = availability_of(svc, self.cluster, groups)
        doc = me_answer(svc, self.cluster, self.hub.servers, free, name, groups, spawn_url(name))
        # A server started since the hub's last poll has no start or activity yet: read it soon.
        self.hub.read_soon({(name, a["server"]) for a in doc["allocations"]})
        self.send(doc)


def availability_of(
    svc: RunningService, cluster: Cluster, groups: list[str], now: datetime | None = None
) -> dict[str, Any]:
    """``api/v1/availability`` of the slices ``groups`` may start (``me``'s ``larger_free``)."""
    allowed = tuple(s for s in svc.catalogue.slices if s.allows(groups))
    doc: dict[str, Any] = cluster.recent(
        ("availability", tuple(s.slug for s in allowed)),
        lambda: availability_document(
            cluster.ledger(), Catalogue(allowed, {}), svc.node_selector, now or datetime.now(UTC)
        ),
    )
    return doc


def spawn_url(name: str, base: str | None = None) -> str:
    """The hub's spawn page of ``name`` (where a larger slice is started); ``base``: the hub's
    base URL (``$JUPYTERHUB_BASE_URL`` when not given)."""
    base = os.environ.get("JUPYTERHUB_BASE_URL", "/") if base is None else base
    return str(url_path_join(base, "hub/spawn", quote(name, safe="")))


def me_answer(
    svc: RunningService,
    cluster: Cluster,
    servers: Iterable[HubServer],
    free: Mapping[str, Any],
    name: str,
    groups: list[str],
    spawn: str,
    *,
    now: int | None = None,
    monotonic: float | None = None,
) -> dict[str, Any]:
    """``api/v1/me`` for ``name``, from the cluster's report, the hub's ``servers`` and ``free``
    (their slices' ``api/v1/availability``): :func:`~gpushare_hub.service.view.me_document`,
    then the pending spawns' places, the budget and the idle returns. ``now`` (Unix seconds)
    and ``monotonic`` (the release history's clock) default to the clocks' readings; the
    tests' golden document (tests/support/golden.py) is made here with fixed ones."""
    now = int(time.time()) if now is None else now
    report = cluster.report()
    when = datetime.fromtimestamp(now, UTC)
    doc = me_document(report, servers, name, when, svc.gpu_idle_after, free, spawn)
    add_queue_places(doc, cluster, getattr(svc, "releases", None), monotonic)
    doc["budget"] = (
        cluster.recent(("budget", name, tuple(groups)), lambda: svc.budgets.document(name, groups))
        if svc.budget_rule.configured
        else None
    )
    mine = held_slices(report, servers, name)
    return add_idle_returns(doc, svc, mine, groups, name, now)


def add_queue_places(
    doc: dict[str, Any], cluster: Cluster, releases: ReleaseHistory | None, now: float | None = None
) -> None:
    """Each of the caller's pending spawns gains ``ahead`` (older pending spawns as large or
    larger, of a card model it could use) and ``estimate`` (None without history). ``now``:
    on the releases' clock (``time.monotonic()`` when not given)."""
    waiting = [(f.row.since, key, f.pending.demand) for key, f in cluster.pods.items() if f.pending and f.row]
    now = time.monotonic() if now is None else now
    for p in doc["pending"]:
        key = f"{p['namespace']}/{p['pod']}"
        mine = next((w for w in waiting if w[1] == key), None)
        if mine is None:
            p["ahead"], p["estimate"] = None, None
            continue
        ahead = sum(
            1 for since, k, d in waiting if k != key and (since, k) < mine[:2] and holds_back(d, mine[2])
        )
        estimate = releases.estimate(mine[2], ahead, now) if releases is not None else None
        p["ahead"] = ahead
        p["estimate"] = estimate.to_json() if estimate is not None else None


def add_idle_returns(
    doc: dict[str, Any],
    svc: RunningService,
    mine: list[HeldSlice],
    groups: list[str],
    name: str,
    now: int,
) -> dict[str, Any]:
    """``api/v1/me`` gains, per allocation idle on the GPU, ``idle_return`` (the action, phase,
    deadline, the words, whether Keep may be pressed); per allocation, ``hibernate_after``
    (seconds a kernel may run nothing before the notebook server hibernates it, where the idle
    action for the caller's groups and the allocation's slice is ``hibernate``, or ``auto`` on a
    node whose driver can hibernate kernels; else None: the
    notebook's extension reads it); and ``returned``: the caller's slices stopped or parked in
    the last day, with the words and the way back. ``mine``: the caller's slices; ``now``: Unix
    seconds."""
    rule = svc.idle.rule
    states = {(st.server, st.pod): st for st in svc.idle.states(mine, {name: groups}, now)}
    over = {(o.slice.namespace, o.slice.pod): o for o in svc.over.states(mine, now)}
    can = {(s.server, s.pod): s.checkpoint for s in mine}
    for a in doc["allocations"]:
        checkpoint = can.get((a["server"], a["pod"]), False)
        a["hibernate_after"] = rule.hibernate_after(groups, str(a.get("slice") or ""), checkpoint)
        st = states.get((a["server"], a["pod"]))
        a["idle_return"] = st.to_json(now) if st is not None else None
        o = over.get((a["namespace"], a["pod"]))
        a["over_slice_return"] = o.to_json(now) if o is not None and svc.over.rule.configured else None
    returned = []
    for act in svc.book.returned(name, now - 86400):
        size = f"{act.units} GiB slice" + (f" ({act.slice})" if act.slice else "")
        how = (
            f"and your server was started again without a GPU (profile {act.detail})"
            if act.what == "parked"
            else "and your server was stopped"
        )
        returned.append(
            {
                "server": act.server,
                "slice": act.slice,
                "units": act.units,
                "what": act.what,
                "at": rfc3339(act.at),
                "idle_seconds": act.idle_seconds,
                "words": f"{returned_words(size, act.idle_seconds)}, {how}. Your files are kept: "
                f"start your {size} again from the spawn page.",
            }
        )
    doc["returned"] = returned
    return doc


class KeepHandler(BaseHandler):
    """``POST api/v1/me/keep`` ``{"server": ""}``: put off the idle action of the caller's slice."""

    server_tokens = users_only = True

    @requires()
    def post(self) -> None:
        user = self.current_user
        self.filters(())
        name = str(user.get("name"))
        server = self._server()
        svc = self.service
        mine = [
            s
            for s in held_slices(self.cluster.report(), self.hub.servers, name)
            if s.user == name and s.server == server
        ]
        now = int(time.time())
        states = svc.idle.states(mine, {name: self.hub.groups.get(name, [])}, now)
        which = f"server {server!r}" if server else "your default server"
        if not states:
            raise web.HTTPError(
                404,
                f"no GPU slice of {which} is idle on the GPU now: nothing to keep (any GPU work "
                "already resets the idle clock)",
            )
        st = states[0]
        if st.action == HIBERNATE:
            raise web.HTTPError(
                409,
                f"the idle rule for {which} only hibernates idle kernels, and the next cell wakes "
                "them with every variable intact: nothing will be returned",
            )
        if not st.can_keep and st.kept_until is None:
            raise web.HTTPError(409, f"the idle rule for {which} only notifies: nothing will be returned")
        until = max(st.deadline, now + svc.idle_rule.keep_seconds)
        if not svc.book.keep(name, server, st.stretch, until, now):
            raise web.HTTPError(
                409,
                f"Keep was already pressed once for this idle stretch of {which}; use the GPU (any "
                "work resets the idle clock), or save your work",
            )
        log.info("%s pressed Keep for %s: the idle action is put off to %d", name, which, until)
        self.send(
            {
                "server": server,
                "kept_until": rfc3339(until),
                "seconds_left": until - now,
            }
        )

    def _server(self) -> str:
        body = self.json_body('{"server": "<name>"} ("" for the default server)', b"{}")
        if not isinstance(body, dict) or set(body) - {"server"}:
            raise web.HTTPError(
                400, 'send a JSON object with only "server" (a server name, "" for the default server)'
            )
        server = body.get("server", "")
        if not isinstance(server, str) or len(server) > 255:
            raise web.HTTPError(400, '"server" must be a server name (a string of at most 255 characters)')
        return server


handlers = [("api/v1/me", MeHandler), ("api/v1/me/keep", KeepHandler)]
