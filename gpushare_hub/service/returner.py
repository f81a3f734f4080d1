"""The service's idle loop: warn, then notify, stop or park the slices idle on the GPU.

Every ``gpu_idle_check_seconds`` the service hands the current (unfiltered, fresh) ledger
document and the hub users' groups to :meth:`IdleReturner.tick`. For each slice idle on the GPU,
:func:`~gpushare_hub.service.idle.idle_states` says what applies; here it is done, once per idle
stretch (the :class:`~gpushare_hub.service.store.ServiceStore` remembers across restarts):

- the warning phase: a Warning event on the pod (``GPUShareIdleWarning``) and a log line;
  ``api/v1/me`` and the notebook's status bar show the words and the Keep button;
- the deadline, ``notify``: an event (``GPUShareIdle``) and a log line, nothing stopped;
- ``stop``: an event (``GPUShareIdleReturned``), a log line with the numbers, then the hub's
  REST API stops the server (``DELETE /users/<user>/server``);
- ``park``: as ``stop``, then, once the server is gone, starts it again on the CPU-only
  profile (``POST /users/<user>/server`` with ``{"profile": <park_profile>}``): the user's home
  and image stay, only the GPU goes back.

Nothing is done while the ledger is stale (the watch failing): a slice is never returned on old
figures, and a slice that did any work since the last reading has no idle clock at all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote

from tornado import httpclient

from gpushare_hub.accounting.store import KEEP_SECONDS
from gpushare_hub.core.durations import duration_words
from gpushare_hub.core.names import IDLE_NOTIFIED_REASON, IDLE_RETURNED_REASON, IDLE_WARNING_REASON

from .idle import DUE, NOTIFY, PARK, STOP, WARNING, IdleRule, IdleState, idle_states
from .store import IdleAction, ServiceStore

log = logging.getLogger("gpushare.service")


# (namespace, pod name, reason, message) -> posted; failures are logged, never raised.
EventPoster = Callable[[str, str, str, str], Awaitable[None]]


class HubAPI:
    """The few hub REST calls the idle loop makes, with the service's token."""

    def __init__(self, api_url: str, token: str) -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token

    def _server_path(self, user: str, server: str) -> str:
        u = quote(user, safe="")
        return f"/users/{u}/servers/{quote(server, safe='')}" if server else f"/users/{u}/server"

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        http = httpclient.AsyncHTTPClient()
        resp = await http.fetch(
            self.api_url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            raise_error=False,
            request_timeout=30,
        )
        try:
            parsed = json.loads(resp.body) if resp.body else None
        except ValueError:
            parsed = None
        return resp.code, parsed

    async def stop(self, user: str, server: str) -> tuple[int, Any]:
        return await self._call("DELETE", self._server_path(user, server))

    async def start(self, user: str, server: str, options: Mapping[str, Any]) -> tuple[int, Any]:
        return await self._call("POST", self._server_path(user, server), dict(options))

    async def user(self, user: str) -> tuple[int, Any]:
        """The hub's model of ``user`` (name, groups, servers)."""
        return await self._call("GET", f"/users/{quote(user, safe='')}")

    async def running(self, user: str, server: str) -> bool | None:
        """Whether the server is running or stopping (None: the hub could not be asked)."""
        status, model = await self._call("GET", f"/users/{quote(user, safe='')}")
        if status != 200 or not isinstance(model, dict):
            return None
        servers = model.get("servers")
        return isinstance(servers, dict) and server in servers


def _message(body: Any) -> Any:
    return (body or {}).get("message") if isinstance(body, dict) else body


async def stop_server(hub: Any, user: str, server: str, rule: str) -> bool:
    """Ask the hub to stop ``user``'s ``server``; False (and an error naming the missing scope)
    when it refuses. ``rule``: the setting that made the service stop it, for the message."""
    status, body = await hub.stop(user, server)
    if status in (202, 204):
        return True
    log.error(
        "the hub refused to stop %s's server %r (HTTP %d: %s); the slice stays. The service's role "
        "needs the 'servers' scope (configure_hub grants it when %s stops or parks).",
        user,
        server,
        status,
        _message(body),
        rule,
    )
    return False


async def start_when_stopped(
    hub: Any, user: str, server: str, options: Mapping[str, Any], timeout: float
) -> bool:
    """Once the hub says ``server`` stopped (``timeout`` seconds at most), start it again with
    ``options`` (a CPU-only profile); whether the hub started it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await hub.running(user, server) is False:
            break
        await asyncio.sleep(1)
    else:
        log.error(
            "%s's server %r did not stop in %.0f s; not started on the CPU profile", user, server, timeout
        )
        return False
    status, body = await hub.start(user, server, options)
    if status in (201, 202):
        log.info(
            "started %s's server %r again on the CPU-only profile %r", user, server, options.get("profile")
        )
        return True
    log.error(
        "the hub refused to start %s's server %r on profile %r (HTTP %d: %s)",
        user,
        server,
        options.get("profile"),
        status,
        _message(body),
    )
    return False


class IdleReturner:
    def __init__(
        self,
        rule: IdleRule,
        store: ServiceStore,
        hub: HubAPI,
        post_event: EventPoster | None = None,
        clock: Callable[[], float] = time.time,
        stop_timeout: float = 300.0,
        keep_seconds: float = KEEP_SECONDS,
    ) -> None:
        """``keep_seconds``: how long Keep presses and what was done are kept (the book's
        retention); older ones are dropped at most once an hour, in :meth:`tick`."""
        self.rule = rule
        self.keep_seconds = keep_seconds
        self._last_prune = float("-inf")
        self.store = store
        self.hub = hub
        self.post_event = post_event
        self.clock = clock
        self.stop_timeout = stop_timeout
        self._parking: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def states(self, doc: Mapping[str, Any], groups: Mapping[str, list[str]]) -> list[IdleState]:
        """The idle states of ``doc``'s allocations (reading the Keep presses of their users only)."""
        allocations = doc["allocations"]
        keeps = self.store.keeps(str(a["hub_user"]) for a in allocations if a.get("hub_user"))
        return idle_states(allocations, groups, self.rule, keeps, int(self.clock()))

    async def tick(self, doc: Mapping[str, Any], groups: Mapping[str, list[str]]) -> list[IdleState]:
        """Act on one fresh ledger document; the states acted on. Records older than
        :attr:`keep_seconds` are dropped first, once an hour."""
        now = int(self.clock())
        if now - self._last_prune >= 3600:
            self.store.forget_before(int(now - self.keep_seconds))
            self._last_prune = now
        acted = []
        for s in self.states(doc, groups):
            done = self.store.done(s.user, s.server, s.stretch)
            if s.phase == WARNING and s.action != NOTIFY and "warned" not in done:
                await self._event(s, IDLE_WARNING_REASON, s.words(now))
                self._record(s, "warned", now)
                acted.append(s)
            elif s.phase == DUE and s.action == NOTIFY and "notified" not in done:
                log.info("%s", self._numbers(s, "notified (the rule only notifies)"))
                await self._event(s, IDLE_NOTIFIED_REASON, s.words(now))
                self._record(s, "notified", now)
                acted.append(s)
            elif s.phase == DUE and s.action in (STOP, PARK) and not done & {"stopped", "parked"}:
                if (s.user, s.server) in self._parking:
                    continue
                await self._return(s, now)
                acted.append(s)
        return acted

    def _numbers(self, s: IdleState, what: str) -> str:
        kept = f", Keep pressed (postponed to {s.kept_until})" if s.kept_until is not None else ""
        return (
            f"idle GPU slice of {s.user}{'/' + s.server if s.server else ''} (pod {s.namespace}/{s.pod}, "
            f"{s.units} GiB, slice {s.slice or 'none'}): no GPU work and no more than an idle context "
            f"held for {s.idle_seconds} s ({duration_words(s.idle_seconds)}); rule: {s.action} after "
            f"{self.rule.return_after} s{kept}: {what}"
        )

    def _record(self, s: IdleState, what: str, now: int, detail: str = "") -> None:
        self.store.record(
            IdleAction(s.user, s.server, s.stretch, what, s.slice, s.units, now, s.idle_seconds, detail)
        )

    async def _event(self, s: IdleState, reason: str, message: str) -> None:
        if self.post_event is None:
            return
        try:
            await self.post_event(s.namespace, s.pod, reason, message)
        except Exception as err:
            log.warning("cannot post the %s event on pod %s/%s: %s", reason, s.namespace, s.pod, err)

    async def _return(self, s: IdleState, now: int) -> None:
        what = (
            f"stopping the server, then starting it on profile {self.rule.park_profile!r}"
            if s.action == PARK
            else "stopping the server"
        )
        log.warning("%s", self._numbers(s, what))
        await self._event(s, IDLE_RETURNED_REASON, s.words(now))
        if not await stop_server(self.hub, s.user, s.server, "an idle action"):
            return
        if s.action == STOP:
            self._record(s, "stopped", now)
            return
        self._record(s, "parked", now, self.rule.park_profile)
        self._parking.add((s.user, s.server))
        task = asyncio.get_running_loop().create_task(self._restart_on_cpu(s))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _restart_on_cpu(self, s: IdleState) -> None:
        try:
            returned = {"slice": s.slice, "units": s.units, "idle_seconds": s.idle_seconds}
            options = {"profile": self.rule.park_profile, "gpushare_returned": returned}
            await start_when_stopped(self.hub, s.user, s.server, options, self.stop_timeout)
        finally:
            self._parking.discard((s.user, s.server))
