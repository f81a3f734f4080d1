"""The one mechanism behind idle return and GiB-hour budgets: warn, wait out the grace, act.

A *policy* (:class:`~gpushare_hub.service.idlepolicy.IdlePolicy`,
:class:`~gpushare_hub.service.budgets.BudgetPolicy`) reads each pass's slices held (fresh figures only)
and says, per user, which *phase* applies now (:class:`Case`): ``warn`` (the user is told what
is coming, once) or ``due`` (the grace is over). It records what was done in the book, so that a
restarted service repeats nothing. The :class:`Enforcer` does the doing, the same for both:

- ``warn``: a Warning event on each of the user's GPU pods, with the policy's words, and a log
  line with the numbers; ``api/v1/me`` and the status bar show the same words;
- ``due`` with ``notify``: an event and a log line, nothing stopped;
- ``due`` with ``stop``: an event, the log line, then the hub's REST API stops each server;
- ``due`` with ``park``: as ``stop``, then, once the hub says each server is gone, starts it
  again on the CPU-only profile: the user's home and image stay, only the GPU goes back.

A server is given back once at a time (a park in progress is not acted on again), and a refusal
of the hub is logged naming the scope the service's role needs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpushare_hub.core.budget import NOTIFY, PARK

from .held import HeldSlice
from .hubapi import HubAPI

log = logging.getLogger("gpushare.service")

WARN, DUE = "warn", "due"
# What a policy records once a case's phase was acted on: warned, notified, or given back.
WARNED, NOTIFIED, RETURNED = "warned", "notified", "returned"

# (namespace, pod name, reason, message) -> posted; failures are logged, never raised.
EventPoster = Callable[[str, str, str, str], Awaitable[None]]


@dataclass(frozen=True)
class Case:
    """One user's slices a policy says are in a phase now, and what was done already."""

    user: str
    servers: tuple[str, ...]
    pods: tuple[tuple[str, str], ...]  # (namespace, pod)
    phase: str  # WARN or DUE
    action: str  # NOTIFY, STOP or PARK (never HIBERNATE: the notebook hibernates, see idlepolicy)
    words: str  # what the user reads now (the event's message)
    numbers: str  # the log line's figures: who, what, how much, which rule
    done: frozenset[str]  # WARNED, NOTIFIED, RETURNED: what was done in this phase's episode
    park_options: Mapping[str, Any] = field(default_factory=dict)  # beside the profile, when parked
    subject: Any = None  # the policy's own record of the case


@dataclass(frozen=True)
class Reasons:
    """The event reasons of a policy's warning, notice and return (``core/names.py``)."""

    warn: str
    notified: str
    returned: str


class Policy(Protocol):
    """What decides the phase, and records what was done (see the module docstring)."""

    reasons: Reasons
    setting: str  # the setting named when the hub refuses to stop a server
    park_profile: str
    warning_logged: bool  # whether a warning is a line in the log too (else only the event)

    def cases(self, held: Sequence[HeldSlice], groups: Mapping[str, list[str]], now: float) -> list[Case]: ...
    def record(self, case: Case, what: str, now: float, stopped: bool = True) -> None: ...


def _message(body: Any) -> Any:
    return (body or {}).get("message") if isinstance(body, dict) else body


async def stop_server(hub: HubAPI, user: str, server: str, setting: str) -> bool:
    """Ask the hub to stop ``user``'s ``server``; False (and an error naming the missing scope)
    when it refuses. ``setting``: what made the service stop it, for the message."""
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
        setting,
    )
    return False


async def start_when_stopped(
    hub: HubAPI, user: str, server: str, options: Mapping[str, Any], timeout: float
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
    profile = options.get("profile")
    if status in (201, 202):
        log.info("started %s's server %r again on the CPU-only profile %r", user, server, profile)
        return True
    log.error(
        "the hub refused to start %s's server %r on profile %r (HTTP %d: %s)",
        user,
        server,
        profile,
        status,
        _message(body),
    )
    return False


class Enforcer:
    """Warns, notifies, stops and parks, as policies say (module docstring)."""

    def __init__(
        self,
        hub: HubAPI | None,
        post_event: EventPoster | None = None,
        clock: Callable[[], float] = time.time,
        stop_timeout: float = 300.0,
    ) -> None:
        self.hub = hub
        self.post_event = post_event
        self.clock = clock
        self.stop_timeout = stop_timeout
        self._parking: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def tick(
        self, policy: Policy, held: Sequence[HeldSlice], groups: Mapping[str, list[str]]
    ) -> list[Case]:
        """One pass of ``policy`` over what is held now (fresh figures); the cases acted on."""
        now = self.clock()
        acted = []
        for case in policy.cases(held, groups, now):
            if case.phase == WARN:
                if WARNED in case.done:
                    continue
                if policy.warning_logged:
                    log.warning("%s: warned: %s", case.numbers, case.words)
                await self.tell(case.pods, policy.reasons.warn, case.words)
                policy.record(case, WARNED, now)
            elif case.action == NOTIFY:
                if NOTIFIED in case.done:
                    continue
                log.info("%s: notified (the rule only notifies)", case.numbers)
                await self.tell(case.pods, policy.reasons.notified, case.words)
                policy.record(case, NOTIFIED, now)
            else:
                if RETURNED in case.done or any((case.user, s) in self._parking for s in case.servers):
                    continue
                log.warning("%s: %s", case.numbers, self._doing(case, policy.park_profile))
                await self.tell(case.pods, policy.reasons.returned, case.words)
                stopped = await self.give_back(case, policy)
                policy.record(case, RETURNED, now, stopped)
            acted.append(case)
        return acted

    @staticmethod
    def _doing(case: Case, profile: str) -> str:
        servers = ", ".join(repr(s) for s in case.servers)
        then = f", then starting it again on profile {profile!r}" if case.action == PARK else ""
        return f"stopping the server {servers}{then}"

    async def tell(self, pods: Iterable[tuple[str, str]], reason: str, message: str) -> None:
        """A Warning event on each pod (once per pod); a failure is logged, never raised."""
        if self.post_event is None:
            return
        for namespace, pod in dict.fromkeys(pods):
            try:
                await self.post_event(namespace, pod, reason, message)
            except Exception as err:
                log.warning("cannot post the %s event on pod %s/%s: %s", reason, namespace, pod, err)

    async def give_back(self, case: Case, policy: Policy) -> bool:
        """Stop each of the case's servers (park: then start each again on the CPU-only profile,
        in the background, once the hub says it is gone); whether the hub stopped them all."""
        results = [await self._give_back(case, server, policy) for server in case.servers]
        return all(results)

    async def _give_back(self, case: Case, server: str, policy: Policy) -> bool:
        if self.hub is None or not await stop_server(self.hub, case.user, server, policy.setting):
            return False
        if case.action == PARK:
            options = {"profile": policy.park_profile, **case.park_options}
            self._parking.add((case.user, server))
            task = asyncio.get_running_loop().create_task(self._park(case.user, server, options))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return True

    async def _park(self, user: str, server: str, options: Mapping[str, Any]) -> None:
        try:
            if self.hub is not None:
                await start_when_stopped(self.hub, user, server, options, self.stop_timeout)
        finally:
            self._parking.discard((user, server))

    async def settled(self) -> None:
        """Wait for the parks in progress (the tests, and a service that stops)."""
        await asyncio.gather(*self._tasks)
