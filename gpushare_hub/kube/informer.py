"""One ledger per process, kept current from the API server (list + watch, as an informer does).

:class:`LedgerInformer` lists Nodes and Pods, feeds them to one
:class:`~gpushare_hub.core.ledger.Ledger`, then watches each kind from its own
list's resourceVersion. Lists are read in pages (``limit``/``continue``, 500 objects each) and
applied page by page, so a relist holds one page, not the whole cluster; a continue token that
expires meanwhile (HTTP 410) starts that list again, and the watch resumes from the
resourceVersion of the list's last page. The ledger object is never replaced: a watch that
expires resumes from the last resourceVersion seen, and one that is too old
(HTTP 410) lists that kind again and brings the same ledger in line with the
list, in the same task that applies that kind's events, so no event is lost
and none is applied to a ledger that was thrown away. Objects that vanished
between two lists are removed, except reservations that their owner still
protects (the extender's binds whose outcome is not known yet).

Subscribers (``on_pod`` / ``on_node``) are called after the ledger has applied
each event, with ``ADDED``, ``MODIFIED`` or ``DELETED`` and the object; a relist
reports every listed object as ``ADDED`` and every vanished one as ``DELETED``
(with only its name, namespace and UID). Every call has a timeout, and every
watch ends on the server's side (``timeoutSeconds``) and, failing that, on ours.

``keep_pod``: a process that needs only some pods (the hub service: those that can hold
or wait for a slice, :func:`~gpushare_hub.core.report.may_hold_slice`) names them, and
only those are told to subscribers and remembered between lists; a kept pod that stops
matching is told as ``DELETED``. The ledger still applies every pod event, so what it
counts never depends on the filter.

``stale_for()`` says how long a watch has been failing (0.0 while all are
healthy, infinity before the first list): the extender's ``/readyz`` turns 503
past a configured time, and comes back once the watches recover.

ResourceClaims (``resource.k8s.io/v1``, the DRA path) are listed and watched the same way when
the API server serves them and the account may read them (:mod:`gpushare_hub.core.claims`
counts our driver's); where it does not, one log line says so and the ledger counts pods'
annotations alone. Only claims of ours (:attr:`~gpushare_hub.core.claims.ClaimObject.ours`: our
driver's devices, or our DeviceClass asked) are applied, remembered and told: ``on_claim``
subscribers hear of each of their events, and of no other claim's (one that stops being ours is
told as ``DELETED``).

Reading each object, applying it to the ledger and telling the subscribers is
:mod:`.ledgerfeed`'s job; this module lists, watches and keeps the watches healthy. Modelled on
KubeSpawner's ``reflector.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable

from kubernetes_asyncio import client

from ..core.objects import pod_key
from ..core.releases import ReleaseHistory
from ..core.resources import DEFAULT_NAMES, ResourceNames
from .api import DEFAULT_TIMEOUTS, OPENED, PAGE, ApiError, Resource, Timeouts, paged
from .ledgerfeed import ALL_KINDS, CLAIMS, KINDS, LedgerFeed, PodFilter

log = logging.getLogger("gpushare.informer")


def _backoff(attempt: int) -> float:
    return float(min(5.0, 0.2 * 2**attempt))


class LedgerInformer(LedgerFeed):
    """Keeps :attr:`ledger` equal to what the API server holds (see the module docstring)."""

    def __init__(
        self,
        api: client.ApiClient | None,
        names: ResourceNames = DEFAULT_NAMES,
        timeouts: Timeouts = DEFAULT_TIMEOUTS,
        protect: Callable[[str, float], bool] = lambda key, listed_at: False,
        clock: Callable[[], float] = time.monotonic,
        keep_pod: PodFilter | None = None,
        page_size: int = PAGE,
        releases: ReleaseHistory | None = None,
        claims: bool = True,
    ) -> None:
        """``api`` None: no API server (unit tests feed events with :meth:`apply`).

        ``protect(pod key, time the list was sent)``: True keeps that pod's assumed
        reservation when a relist does not show the pod (its bind is still in flight, or
        was confirmed after the list was taken; the binder decides).

        ``keep_pod(pod)``: the pods subscribers hear of (see the module docstring); None: all.

        ``page_size``: objects per list answer (a relist holds one page at a time).

        ``releases``: where each allocation that ends (its pod deleted or finished) is recorded,
        on ``clock``'s time, for the waiting spawns' estimates; it may outlive this informer.

        ``claims``: also list and watch ResourceClaims, where the API server serves them.
        """
        super().__init__(names, keep_pod, releases, clock)
        self.timeouts = timeouts
        self.protect = protect
        self.page_size = page_size
        self._resources = {k: Resource(api, k, timeouts) for k in KINDS} if api is not None else {}
        if api is not None and claims:
            try:
                self._resources[CLAIMS] = Resource(api, CLAIMS, timeouts)
            except ValueError as err:
                log.warning("ResourceClaims are not counted: %s", err)
        self.claims_watched = False  # set by start() once ResourceClaims could be listed
        self._claims_told = False
        self._rv: dict[str, str] = dict.fromkeys(ALL_KINDS, "")
        self._failing_since: dict[str, float | None] = dict.fromkeys(ALL_KINDS)
        self._tasks: list[asyncio.Task[None]] = []
        self.synced = False
        self.relists = 0

    # ---- health --------------------------------------------------------------------------
    def stale_for(self) -> float:
        """Seconds the longest-failing watch has been failing; 0.0 if none, inf before the first list."""
        if not self.synced:
            return math.inf
        since = [t for t in self._failing_since.values() if t is not None]
        return max(0.0, self._clock() - min(since)) if since else 0.0

    def _failing(self, kind: str) -> None:
        if self._failing_since[kind] is None:
            self._failing_since[kind] = self._clock()

    def _healthy(self, kind: str) -> None:
        since = self._failing_since[kind]
        if since is not None:
            log.info("%s watch is back after %.1fs", kind, self._clock() - since)
        self._failing_since[kind] = None

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """List both kinds (nodes first, so pods find their cards), then watch both. Raises
        if the first list fails; the caller retries."""
        for kind in KINDS:
            await self.relist(kind)
        await self._list_claims()
        self.synced = True
        self._watch_all()
        log.info(
            "ledger read from the API server: %d GPU nodes, %d pods holding slices",
            len(self.ledger.node_names),
            len(self.ledger.allocations()),
        )

    async def resync(self) -> None:
        """List both kinds again, the watches paused meanwhile so that no event interleaves
        (the extender does this when it becomes the leader, to see the last leader's binds)."""
        await self.stop()
        for kind in KINDS:
            await self.relist(kind)
        await self._list_claims()
        self._watch_all()

    def _watch_all(self) -> None:
        kinds = (*KINDS, CLAIMS) if self.claims_watched else KINDS
        self._tasks = [asyncio.create_task(self._watch_loop(kind), name=f"watch-{kind}") for kind in kinds]

    async def _list_claims(self) -> None:
        """List ResourceClaims if the API server serves resource.k8s.io/v1 to us; else say once
        that the ledger counts annotations alone."""
        if CLAIMS not in self._resources:
            return
        try:
            await self.relist(CLAIMS)
        except ApiError as err:
            if err.status not in (403, 404):
                raise
            if not self._claims_told:
                self._claims_told = True
                log.warning(
                    "ResourceClaims (resource.k8s.io/v1) are not counted: the API server answered %s %s "
                    "(%s); the ledger counts pods' annotations alone. The DRA path needs Kubernetes 1.34 or "
                    "newer and list and watch on resourceclaims in all namespaces.",
                    err.status,
                    err.reason,
                    "not served" if err.status == 404 else "forbidden",
                )
            self.claims_watched = False
            del self._resources[CLAIMS]
            return
        self.claims_watched = True

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []

    async def relist(self, kind: str) -> None:
        """List ``kind`` and bring the same ledger in line with it (no event is skipped:
        this runs in the task that applies that kind's events). The list is read and applied
        page by page; if it has to start again (an expired continue token), what vanished is
        judged on the list that completed."""
        listed_at = self._clock()
        listed: set[str] = set()
        rv = ""
        async for page in paged(self._resources[kind].list_page, self.page_size):
            if page.restart:
                log.info("%s list: continue token expired after %d objects; listing again", kind, len(listed))
                listed_at, listed = self._clock(), set()
            for obj in page.items:
                meta = obj.get("metadata") or {}
                listed.add(str(meta.get("name")) if kind == "nodes" else pod_key(obj))
                self.apply(kind, "ADDED", obj)
            rv = page.resource_version  # the last page's: where the watch resumes
            del page  # hold one page at a time
        if kind == "nodes":
            gone_nodes = {*self.ledger.node_names, *self.ledger.unreadable_nodes(), *self._reported[kind]}
            for name in sorted(gone_nodes - listed):
                self.apply(kind, "DELETED", {"metadata": {"name": name}})
        elif kind == CLAIMS:
            for key in sorted({*self.ledger.claims(), *self._reported[kind]} - listed):
                namespace, _, name = key.partition("/")
                self.apply(kind, "DELETED", {"metadata": {"namespace": namespace, "name": name}})
        else:
            vanished = {k: v for k, v in self._reported[kind].items() if k not in listed}
            for alloc in self.ledger.allocations():
                if alloc.key not in listed and not self.ledger.held_by_claim(alloc.key):
                    namespace, _, name = alloc.key.partition("/")
                    vanished.setdefault(alloc.key, {"namespace": namespace, "name": name, "uid": alloc.uid})
            for key, ident in sorted(vanished.items()):
                held = self.ledger.allocation(key)
                if held is not None and held.assumed and self.protect(key, listed_at):
                    continue
                self.apply(kind, "DELETED", {"metadata": ident})
        self._rv[kind] = rv
        self.relists += 1
        self._healthy(kind)

    async def _watch_loop(self, kind: str) -> None:
        attempt = 0
        must_list = False
        while True:
            try:
                if must_list:
                    await self.relist(kind)
                    must_list = False
                async for etype, obj in self._resources[kind].watch(self._rv[kind]):
                    self._healthy(kind)  # OPENED included: answered, though maybe quiet
                    attempt = 0
                    if etype == OPENED:
                        continue
                    rv = (obj.get("metadata") or {}).get("resourceVersion", "")
                    if rv:
                        self._rv[kind] = rv
                    if etype != "BOOKMARK":
                        self.apply(kind, etype, obj)
                self._healthy(kind)  # the server ended the watch as asked: resume from _rv
                attempt = 0
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                if err.status == 410:
                    log.info("%s watch expired (resource version too old): listing again", kind)
                    must_list = True
                    continue
                self._failing(kind)
                log.warning("%s watch failed: %s %s; retrying", kind, err.status, err.reason)
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
            except Exception as err:  # connection refused or reset, timeouts, API server restarts
                self._failing(kind)
                log.warning("%s watch broke: %s; retrying", kind, type(err).__name__ + f" {err}".rstrip())
                await asyncio.sleep(_backoff(attempt))
                attempt += 1
