"""The gpushare hub service: tornado handlers with JupyterHub OAuth, and their data sources.

Two watchers keep what the handlers read current:

- :class:`~gpushare_hub.kube.informer.LedgerInformer` (the extender's and the spawner's
  watch code) keeps the core ledger, through
  :class:`~gpushare_hub.kube.ledger_source.SharedLedger` (trusted only while fresh). It hears
  only of the pods that can hold or wait for a slice
  (:func:`~gpushare_hub.core.report.may_hold_slice`), and :class:`Cluster`, its subscriber,
  keeps of those and of the GPU nodes only the few facts the dashboard shows beside the
  ledger (:class:`~gpushare_hub.core.report.PodFacts`,
  :class:`~gpushare_hub.core.report.NodeFacts`); the report is made from both
  (:func:`~gpushare_hub.core.report.report_from_ledger`), as ``kubectl inspect gpushare``
  makes it from a list;
- :class:`HubServers` polls the hub's REST API (``GET /hub/api/users?state=active``) with the
  service's own token for each server's start and last activity and each user's groups.

Access: every handler needs ``access:services!service=<name>`` (JupyterHub's default for a
service); the rest is decided on the token's own scopes (:mod:`.access`): the admin routes need
``custom:<name>:admin`` (or a hub admin's ``admin:users`` / ``admin-ui``) on the token,
``metrics`` ``custom:<name>:metrics``; a server token may call ``api/v1/me`` and Keep only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import zoneinfo
from collections.abc import Callable, Collection, Hashable
from datetime import UTC, datetime
from functools import partial
from html import escape
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlparse

# Handlers and the OAuth callback share HubOAuth.instance(), which keeps the OAuth (PKCE) states.
from jupyterhub.services.auth import (  # type: ignore[import-untyped]
    HubOAuthCallbackHandler,
    HubOAuthenticated,
)
from jupyterhub.utils import url_path_join  # type: ignore[import-untyped]
from tornado import httpclient, web
from tornado.httputil import url_concat
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Dict, Enum, Float, Integer, List, TraitError, Unicode, validate
from traitlets.config import Application, Config

from gpushare_hub.accounting.store import BudgetStore
from gpushare_hub.core import Ledger, NodeObject, PodObject, ResourceNames
from gpushare_hub.core.budget import BUDGET_ACTIONS, WINDOWS
from gpushare_hub.core.catalogue import Catalogue, CatalogueError, read_catalogue
from gpushare_hub.core.history import WAITED_AFTER, history_rows, to_csv
from gpushare_hub.core.planning import PlanningError
from gpushare_hub.core.queue import holds_back
from gpushare_hub.core.releases import ReleaseHistory
from gpushare_hub.core.report import (
    NodeFacts,
    PendingPod,
    PodFacts,
    Report,
    may_hold_slice,
    node_facts,
    pod_facts,
    report_from_ledger,
)
from gpushare_hub.kube.ledger_source import Informer, SharedLedger
from gpushare_hub.web.bodylimit import SERVER_MAX_BODY, LimitedBody

from .access import COOKIE_REFUSAL, SERVER, SERVICE, Caller, refusal, xsrf_sent
from .budgets import BudgetKeeper, BudgetRule
from .hubconfig import CONFIG_ENV
from .idle import ACTIONS, NOTIFY, PARK, IdleRule, duration_words
from .metrics import pending_labels, render_metrics
from .planning import catalogue_sizes, cluster_shape, plan_from_history, plans_for
from .query import query_values
from .returner import HubAPI, IdleReturner
from .store import ServiceStore
from .view import (
    FILTER_KEYS,
    Filters,
    HubServer,
    QueryError,
    availability_document,
    ledger_document,
    me_document,
    parse_query,
    servers_from_users,
)

log = logging.getLogger("gpushare.service")
# The largest request body (Keep's and a budget addition's JSON need a few dozen bytes).
MAX_BODY_BYTES = 4096
# How long one api/v1/me computation serves every caller, unless the cluster changed before.
ME_CACHE_SECONDS = 2.0


def service_informer(api: Any, names: ResourceNames, releases: ReleaseHistory | None = None) -> Any:
    """The service's informer: it hears only of the pods that can hold or wait for a slice
    (the ledger still reads every pod event, so no allocation is missed). ``releases``: where
    ended allocations are recorded, for the waiting spawns' estimates."""
    from gpushare_hub.kube.informer import LedgerInformer

    return LedgerInformer(api, names, keep_pod=partial(may_hold_slice, names=names), releases=releases)


class Cluster:
    """The informer's ledger and, beside it, the facts the report needs (module docstring)."""

    def __init__(
        self,
        make_informer: Callable[[], Any],
        names: ResourceNames,
        max_stale: float,
        hub_namespaces: Collection[str] | None = None,
    ) -> None:
        self.names = names
        self.hub_namespaces = hub_namespaces
        self.nodes: dict[str, NodeFacts] = {}  # GPU nodes, and nodes whose inventory is unreadable
        self.pods: dict[str, PodFacts] = {}  # active pods that ask for a GPU
        self._make = make_informer
        self._ledger = Ledger(names)  # the last subscribed informer's (empty before the first)
        self.shared = SharedLedger(self._subscribed, max_stale)
        self._version = 0  # bumped on every event: the report is rebuilt only after a change
        self._report: tuple[int, Report] | None = None
        self._recent: dict[Hashable, tuple[int, float, Any]] = {}

    def _subscribed(self) -> Informer:
        informer = self._make()
        self.nodes.clear()
        self.pods.clear()
        self._ledger = informer.ledger
        self._version += 1
        informer.on_node(self._on_node)
        informer.on_pod(self._on_pod)
        return informer  # type: ignore[no-any-return]

    def _on_node(self, etype: str, obj: NodeObject) -> None:
        self._version += 1
        facts = node_facts(obj, self.names)
        if etype != "DELETED" and (facts.offers_gpu_memory or self._ledger.node(facts.name) is not None):
            self.nodes[facts.name] = facts
        else:
            self.nodes.pop(facts.name, None)

    def _on_pod(self, etype: str, obj: PodObject) -> None:
        self._version += 1
        facts = None if etype == "DELETED" else pod_facts(obj, self.names, self.hub_namespaces)
        if facts is not None:
            self.pods[facts.key] = facts
        else:
            self.pods.pop(obj.key, None)

    def pending(self) -> dict[str, PendingPod]:
        """The GPU pods on no node yet, by ``namespace/name`` (for the metrics)."""
        return {key: f.pending for key, f in self.pods.items() if f.pending is not None}

    def ledger(self) -> Ledger | None:
        return self.shared()

    def report(self) -> Report:
        if self._report is None or self._report[0] != self._version:
            report = report_from_ledger(self._ledger, self.nodes.values(), self.pods.values())
            self._report = (self._version, report)
        return self._report[1]

    def recent(self, key: Hashable, make: Callable[[], Any], ttl: float = ME_CACHE_SECONDS) -> Any:
        """What ``make`` returned for ``key`` less than ``ttl`` seconds ago and before no cluster
        event since; else ``make()`` now. Every notebook server asks ``api/v1/me`` every few
        seconds (the status bar): one document serves them all."""
        now = time.monotonic()
        hit = self._recent.get(key)
        if hit is not None and hit[0] == self._version and now - hit[1] < ttl:
            return hit[2]
        value = make()
        if len(self._recent) > 1000:
            self._recent.clear()
        self._recent[key] = (self._version, now, value)
        return value

    def stale_for(self) -> float:
        informer = self.shared.informer
        return informer.stale_for() if informer is not None else float("inf")


class HubServers:
    """The hub's active servers and users' groups, polled with the service's token."""

    # A server that started since the last read shows no start or activity; a page or API call
    # that meets one asks for a read at once, at most this often (seconds).
    soonest = 1.0

    def __init__(self, api_url: str, token: str) -> None:
        self.api_url = api_url
        self.token = token
        self.servers: list[HubServer] = []
        self.groups: dict[str, list[str]] = {}
        self.error = ""
        self._last_read = float("-inf")  # monotonic time of the last read's start
        self._reading: asyncio.Task[None] | None = None
        self._inactive_groups: dict[str, tuple[float, list[str]]] = {}

    # How long the groups of a user with no active server, read for api/v1/me, are believed.
    groups_ttl = 60.0

    async def groups_of(self, user: str) -> list[str]:
        """``user``'s hub groups: from the last poll when they have an active server, else read
        from the hub (kept :attr:`groups_ttl` seconds; none when the hub cannot say)."""
        if user in self.groups:
            return self.groups[user]
        now = time.monotonic()
        hit = self._inactive_groups.get(user)
        if hit is not None and now - hit[0] < self.groups_ttl:
            return hit[1]
        from .returner import HubAPI

        try:
            status, model = await HubAPI(self.api_url, self.token).user(user)
        except Exception as err:
            log.warning("cannot read %s's groups from the hub: %s", user, err)
            return hit[1] if hit is not None else []
        groups = (
            [str(g) for g in model.get("groups") or []] if status == 200 and isinstance(model, dict) else []
        )
        if len(self._inactive_groups) > 5000:
            self._inactive_groups.clear()
        self._inactive_groups[user] = (now, groups)
        return groups

    def read_soon(self, holders: Collection[tuple[str, str]]) -> None:
        """Read the hub again now if it has not named one of ``holders`` ((user, server) pairs
        holding slices) and no read started in the last :attr:`soonest` seconds or is running."""
        known = {(s.user, s.server) for s in self.servers}
        if all(h in known for h in holders):
            return
        if self._reading is not None and not self._reading.done():
            return
        if time.monotonic() - self._last_read < self.soonest:
            return
        self._reading = asyncio.get_running_loop().create_task(self.poll())

    async def poll(self) -> None:
        self._last_read = time.monotonic()
        http = httpclient.AsyncHTTPClient()
        users: list[Any] = []
        offset = 0
        try:
            while True:
                query = urlencode({"state": "active", "offset": offset, "limit": 200})
                resp = await http.fetch(
                    f"{self.api_url}/users?{query}",
                    headers={
                        "Authorization": f"token {self.token}",
                        "Accept": "application/jupyterhub-pagination+json",
                    },
                    request_timeout=10,
                )
                body = json.loads(resp.body)
                items = body.get("items", []) if isinstance(body, dict) else body
                users += items
                nxt = (body.get("_pagination") or {}).get("next") if isinstance(body, dict) else None
                if not nxt or not items:
                    break
                offset = int(nxt.get("offset", offset + len(items)))
        except Exception as err:  # the hub restarting, a bad answer: keep the last known servers
            self.error = f"cannot read the hub's users: {err}"
            log.warning("%s", self.error)
            return
        self.servers, self.groups = servers_from_users(users)
        self.error = ""


class GPUShareService(Application):
    """``python -m gpushare_hub.service``: the GPU-slices dashboard, JSON API and metrics."""

    name = "gpushare-hub-service"
    description = __doc__

    slices = List(
        Dict(),
        config=True,
        help="""
        The slice catalogue, in ``c.GPUShareSpawner.slices``'s format and checked by the same
        rules (``configure_hub`` passes the spawner's). Availability is reported per slice;
        fragmentation counts free memory that no slice here can use.
        """,
    )
    node_selector = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        config=True,
        help="""Labels the GPU pods carry as their node selector (KubeSpawner's ``node_selector``
        merged with ``gpu_node_selector``); availability counts only the nodes that have them.""",
    )
    admin_scope = Unicode(
        "custom:gpushare:admin",
        config=True,
        help="The scope that opens the dashboard and api/v1/ledger (hub admins may always).",
    )
    metrics_scope = Unicode(
        "custom:gpushare:metrics",
        config=True,
        help="The scope that lets a token read ``metrics`` (the admin scope includes it).",
    )
    quota_gib_per_user = Integer(
        None, allow_none=True, config=True, help="As GPUShareSpawner's: shown, not enforced here."
    )
    quota_gib_per_group = Dict(
        key_trait=Unicode(),
        value_trait=Integer(),
        config=True,
        help="As GPUShareSpawner's; the metrics report each group's use against it.",
    )
    quota_gib_hours = Float(
        None,
        allow_none=True,
        min=0,
        config=True,
        help="As GPUShareSpawner's (configure_hub passes it): each user's GiB·h per window.",
    )
    quota_gib_hours_per_group = Dict(
        key_trait=Unicode(),
        value_trait=Float(min=0),
        config=True,
        help="As GPUShareSpawner's: per-group overrides of quota_gib_hours (the largest applies).",
    )
    quota_gib_hours_window = Enum(
        WINDOWS, default_value="week", config=True, help="As GPUShareSpawner's: day, week or month."
    )
    quota_gib_hours_timezone = Unicode(
        "UTC", config=True, help="As GPUShareSpawner's: the IANA zone whose midnight starts a window."
    )
    budget_action = Enum(
        list(BUDGET_ACTIONS),
        default_value="stop",
        config=True,
        help="""
        What happens to a user's servers that still hold GPU slices once their GiB·h budget is
        spent: they are warned (an event on each pod, api/v1/me, the log), then, after
        budget_grace_seconds, "stop" stops them, "park" restarts them on gpu_idle_park_profile
        (a CPU-only profile: files and image stay), "notify" leaves them. An admin's addition
        that leaves the budget unspent, within the grace, withdraws the warning.
        """,
    )
    history_retention_days = Integer(
        90,
        min=62,
        config=True,
        help="""Days the record of every slice held (api/v1/history, for capacity planning; the
        GiB·h budgets count from it too) is kept in state_db. At least 62: the budgets need the
        last month.""",
    )
    budget_grace_seconds = Float(
        900.0, min=0, config=True, help="Seconds between the budget-spent warning and budget_action."
    )
    gpu_memory_resource = Unicode("aliyun.com/gpu-mem", config=True, help="Extended resource of GPU memory.")
    gpu_count_resource = Unicode(
        "aliyun.com/gpu-count", config=True, help="Extended resource of whole cards."
    )
    kubeconfig = Unicode(
        "",
        config=True,
        help="kubeconfig file of the service's Kubernetes identity (default: $KUBECONFIG, then "
        "~/.kube/config). It needs only list and watch on nodes and on pods in all namespaces.",
    )
    in_cluster = Bool(False, config=True, help="Use the pod's service account instead of a kubeconfig.")
    hub_namespaces = List(
        Unicode(),
        config=True,
        help="""
        Namespaces where the hub's spawner creates notebook pods (KubeSpawner's ``namespace``;
        ``configure_hub`` passes it). Only pods there are attributed to a hub user and count in
        ``api/v1/me``: the ``hub.jupyter.org/username`` annotation is believed nowhere else,
        since whoever may create a pod in another namespace could write someone else's name on
        it. Empty: the namespace of the service's own pod when it runs in one, else ``default``
        (as KubeSpawner chooses).
        """,
    )
    gpu_idle_after = Integer(
        1800,
        min=1,
        config=True,
        help="""
        Seconds after which a slice idle on the GPU is flagged idle (``gpu_idle`` in
        api/v1/ledger and api/v1/me, the dashboard's "idle on the GPU" mark, the
        gpushare_user_gpu_idle_slices metric). A slice is idle while its processes hold no more
        than the device plugin's --idle-memory-mib and do no work at all; the plugin publishes
        when that began, so the clock survives restarts of the plugin and of this service.
        """,
    )
    gpu_idle_action = Enum(
        list(ACTIONS),
        default_value=NOTIFY,
        config=True,
        help="""
        What happens to a slice idle on the GPU for gpu_idle_return_after seconds: "notify" (an
        event on the pod and a line in the log; the user reads it in api/v1/me and the notebook's
        status bar), "stop" (the hub stops the server), "park" (the hub stops it and starts it
        again on gpu_idle_park_profile, a CPU-only profile: the user's home and image stay, only
        the GPU goes back) or "none". The user is warned gpu_idle_warn_before seconds ahead and
        may press Keep once per idle stretch. Never while the GPU is in use: any GPU work, or
        holding more than the device plugin's --idle-memory-mib, ends the idle stretch.
        """,
    )
    gpu_idle_action_per_group = Dict(
        key_trait=Unicode(),
        value_trait=Enum(list(ACTIONS)),
        config=True,
        help="Per hub group, the action for its members' slices; the mildest of a user's groups applies.",
    )
    gpu_idle_action_per_slice = Dict(
        key_trait=Unicode(),
        value_trait=Enum(list(ACTIONS)),
        config=True,
        help="Per catalogue slice (slug), the action for slices of that kind; before the groups'.",
    )
    gpu_idle_exempt_groups = List(
        Unicode(),
        config=True,
        help="Hub groups whose members' slices are never warned about, stopped or parked.",
    )
    gpu_idle_return_after = Integer(
        7200,
        min=1,
        config=True,
        help="Seconds a slice may stay idle on the GPU before gpu_idle_action is taken.",
    )
    gpu_idle_warn_before = Integer(
        600,
        min=0,
        config=True,
        help="Seconds before the action that the user is warned (api/v1/me, status bar, event).",
    )
    gpu_idle_keep_seconds = Integer(
        3600,
        min=1,
        config=True,
        help="Keep (POST api/v1/me/keep) puts the action off to this many seconds after the press, "
        "once per idle stretch.",
    )
    gpu_idle_park_profile = Unicode(
        "",
        config=True,
        help="""The profile_list slug a parked server starts on again: a CPU-only profile of the
        spawner (no slice). Needed when any idle action is "park".""",
    )
    gpu_idle_check_seconds = Float(30.0, config=True, help="How often the idle rule is applied.")
    queue_estimate_after = Float(
        600.0,
        min=0,
        config=True,
        help="""Seconds the service must have watched the cluster before api/v1/me estimates a
        waiting spawn's wait (from how often slices as large were released lately, 6 h at most);
        never with fewer than two such releases.""",
    )
    state_db = Unicode(
        "gpushare-service.sqlite",
        config=True,
        help="""The service's SQLite file (Keep presses, what was done to idle slices, the GiB·h
        book of budgets, which the spawner reads as its budget_db), relative to
        its working folder: the hub's, whose volume keeps JupyterHub's own database.""",
    )
    refresh_seconds = Integer(
        5,
        config=True,
        help="How often the dashboard page reads api/v1/ledger again (?refresh= overrides it).",
    )
    hub_poll_seconds = Float(
        5.0,
        config=True,
        help="How often the hub's users and servers are read (start, last activity, groups).",
    )
    ledger_max_staleness = Float(
        30.0,
        config=True,
        help="Seconds a failing watch may go on before availability is reported as unknown.",
    )
    ip = Unicode("", config=True, help="Address to listen on (default: from $JUPYTERHUB_SERVICE_URL).")
    port = Integer(
        0, min=0, max=65535, config=True, help="Port to listen on (default: from $JUPYTERHUB_SERVICE_URL)."
    )

    aliases = {  # noqa: RUF012 - traitlets reads these class attributes
        "config": "GPUShareService.config_file",
        "kubeconfig": "GPUShareService.kubeconfig",
        "ip": "GPUShareService.ip",
        "port": "GPUShareService.port",
        "log-level": "Application.log_level",
    }
    flags = {  # noqa: RUF012
        "in-cluster": ({"GPUShareService": {"in_cluster": True}}, "use the pod's service account")
    }
    config_file = Unicode("", config=True, help="A Python config file (c.GPUShareService.slices = [...]).")

    @validate("slices")
    def _validate_slices(self, proposal: Any) -> Any:
        read_catalogue(proposal.value, (), self.resource_names)
        return proposal.value

    @property
    def resource_names(self) -> ResourceNames:
        return ResourceNames(memory=self.gpu_memory_resource, count=self.gpu_count_resource)

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        env = os.environ.get(CONFIG_ENV)
        if env:
            try:
                settings = json.loads(env)
            except ValueError as err:
                raise ServiceConfigError(
                    f"${CONFIG_ENV} is not JSON ({err}); configure_hub() writes it, or set it to "
                    '{"GPUShareService": {...}}'
                ) from None
            if not isinstance(settings, dict) or not all(isinstance(v, dict) for v in settings.values()):
                raise ServiceConfigError(
                    f"${CONFIG_ENV} must be a JSON object of sections, e.g. "
                    '{"GPUShareService": {"slices": [...]}}'
                )
            self.update_config(Config(settings))
        if self.config_file:
            path = Path(self.config_file)
            if not path.is_file():
                raise ServiceConfigError(
                    f"--config {self.config_file}: no such file; give a Python config file"
                )
            self.load_config_file(str(path))
        self.update_config(self.cli_config)  # the command line wins
        self.catalogue: Catalogue = read_catalogue(self.slices, (), self.resource_names)
        self.idle_rule = self._idle_rule()
        self.budget_rule = self._budget_rule()

    def _budget_rule(self) -> BudgetRule:
        try:
            tz = zoneinfo.ZoneInfo(self.quota_gib_hours_timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as err:
            raise ServiceConfigError(
                f"quota_gib_hours_timezone {self.quota_gib_hours_timezone!r} is not a time zone ({err}); "
                "use an IANA name such as 'UTC' or 'Europe/Berlin'"
            ) from None
        rule = BudgetRule(
            per_user=self.quota_gib_hours,
            per_group=dict(self.quota_gib_hours_per_group),
            window=self.quota_gib_hours_window,
            tz=tz,
            grace=self.budget_grace_seconds,
            action=self.budget_action,
            park_profile=self.gpu_idle_park_profile,
        )
        if rule.configured and rule.action == PARK and not rule.park_profile:
            raise ServiceConfigError(
                'budget_action is "park" but gpu_idle_park_profile is empty: name the spawner\'s '
                "CPU-only profile_list slug a parked server starts on"
            )
        return rule

    def _idle_rule(self) -> IdleRule:
        rule = IdleRule(
            action=self.gpu_idle_action,
            per_group=dict(self.gpu_idle_action_per_group),
            per_slice=dict(self.gpu_idle_action_per_slice),
            exempt_groups=frozenset(self.gpu_idle_exempt_groups),
            return_after=self.gpu_idle_return_after,
            warn_before=self.gpu_idle_warn_before,
            keep_seconds=self.gpu_idle_keep_seconds,
            park_profile=self.gpu_idle_park_profile,
        )
        parks = PARK in (rule.action, *rule.per_group.values(), *rule.per_slice.values())
        if parks and not rule.park_profile:
            raise ServiceConfigError(
                'an idle action is "park" but gpu_idle_park_profile is empty: name the spawner\'s '
                "CPU-only profile_list slug a parked server starts on"
            )
        slugs = {s.slug for s in self.catalogue.slices}
        if rule.park_profile in slugs:
            raise ServiceConfigError(
                f"gpu_idle_park_profile {rule.park_profile!r} is a GPU slice of the catalogue; name a "
                "CPU-only profile_list entry, so that a parked server holds no GPU"
            )
        unknown = sorted(set(rule.per_slice) - slugs)
        if unknown:
            raise ServiceConfigError(
                f"gpu_idle_action_per_slice names {', '.join(unknown)}, not slices of the catalogue "
                f"({', '.join(sorted(slugs)) or 'none'})"
            )
        return rule

    _planning_lock: asyncio.Lock | None = None

    @property
    def planning_lock(self) -> asyncio.Lock:
        """Held while api/v1/planning computes: one plan at a time."""
        if self._planning_lock is None:
            self._planning_lock = asyncio.Lock()
        return self._planning_lock

    def trusted_namespaces(self) -> frozenset[str]:
        """:attr:`hub_namespaces`, or KubeSpawner's default namespace when it is empty."""
        if self.hub_namespaces:
            return frozenset(self.hub_namespaces)
        own = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        try:
            return frozenset([own.read_text().strip() or "default"])
        except OSError:
            return frozenset(["default"])

    # ---- wiring --------------------------------------------------------------------------------
    def _make_informer(self) -> Any:
        return service_informer(self._api, self.resource_names, self.releases)

    def make_app(self, cluster: Cluster, hub: HubServers) -> web.Application:
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpushare/")
        settings: dict[str, Any] = {
            "service": self,
            "cluster": cluster,
            "hub": hub,
            "prefix": prefix,
            "service_name": os.environ.get("JUPYTERHUB_SERVICE_NAME", "gpushare"),
            "cookie_secret": os.urandom(32),
            "max_body_bytes": MAX_BODY_BYTES,
        }
        routes: list[Any] = [
            (prefix, DashboardHandler),
            (url_path_join(prefix, "api/v1/ledger"), LedgerHandler),
            (url_path_join(prefix, "api/v1/availability"), AvailabilityHandler),
            (url_path_join(prefix, "api/v1/me"), MeHandler),
            (url_path_join(prefix, "api/v1/me/keep"), KeepHandler),
            (url_path_join(prefix, "api/v1/budgets"), BudgetsHandler),
            (url_path_join(prefix, "api/v1/history"), HistoryHandler),
            (url_path_join(prefix, "api/v1/planning"), PlanningHandler),
            (url_path_join(prefix, "api/v1/budgets/([^/]+)"), BudgetAddHandler),
            (url_path_join(prefix, "metrics"), MetricsHandler),
            (url_path_join(prefix, "oauth_callback"), OAuthCallbackHandler),
            (prefix.rstrip("/"), ToPrefixHandler),
        ]
        # Every path, routed or not, streams its body and refuses it past the limit (tornado
        # would read a body whole for its own 404 handler, up to the server's max_body_size).
        return web.Application(routes, default_handler_class=NotFoundHandler, **settings)

    async def _connect(self) -> None:
        """Reach the API server (retrying every 10 s with the reason logged), then keep watching."""
        from gpushare_hub.kube.kubeconfig import in_cluster_problem, kubeconfig_problem

        # The service's default is the kubeconfig kubectl would use, not the pod's account.
        path = self.kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or "~/.kube/config"
        while True:
            try:
                problem = in_cluster_problem() if self.in_cluster else kubeconfig_problem(path)
                if problem:
                    raise ValueError(problem)
                # Imported here: kubernetes_asyncio looks for a home folder as it loads, which
                # fails for a user without one (caught and named below, not lost in the task).
                from gpushare_hub.kube.api import make_api_client

                self._api = await make_api_client(self.kubeconfig or None, self.in_cluster)
                break
            except Exception as err:
                log.error(
                    "cannot set up a Kubernetes client (%s); the dashboard shows no cards until this "
                    "works. Set KUBECONFIG (or --kubeconfig) to a kubeconfig that may list and watch "
                    "nodes and pods, or run in a pod with --in-cluster. Retrying in 10 s.",
                    err,
                )
                await asyncio.sleep(10)
        await self.cluster.shared.ensure_started()
        PeriodicCallback(self.cluster.shared.ensure_started, 5_000).start()

    async def post_event(self, namespace: str, pod: str, reason: str, message: str) -> None:
        """A Warning event on a pod of the hub (the service's identity may create events there)."""
        from kubernetes_asyncio.client import CoreV1Api

        from gpushare_hub.kube.events import warning_event

        api = getattr(self, "_api", None)
        if api is None:
            raise RuntimeError("no Kubernetes client yet")
        core = CoreV1Api(api)
        live = await core.read_namespaced_pod(pod, namespace)
        involved = {"kind": "Pod", "name": pod, "namespace": namespace, "uid": live.metadata.uid}
        body: Any = warning_event(involved, namespace, reason, message, "gpushare-service")
        await core.create_namespaced_event(namespace, body)

    async def apply_idle_rule(self) -> None:
        """One pass of the idle loop and the budgets' book, on fresh figures only (see
        :mod:`.returner` and :mod:`.budgets`)."""
        if self.cluster.ledger() is None:  # the watch is failing: never act on old figures
            return
        doc = ledger_document(
            self.cluster.report(),
            self.hub_servers.servers,
            self.catalogue,
            datetime.now(UTC),
            gpu_idle_after=self.gpu_idle_after,
        )
        try:
            await self.returner.tick(doc, self.hub_servers.groups)
        except Exception:
            log.exception(
                "the idle rule failed this pass; it runs again in %.0f s", self.gpu_idle_check_seconds
            )
        try:
            holders = {str(a["hub_user"]) for a in doc["allocations"] if a["hub_user"]}
            groups = dict(self.hub_servers.groups)
            for user in holders - set(groups):  # started since the last poll of the hub
                groups[user] = await self.hub_servers.groups_of(user)
            models = {c["uuid"]: c["model"] for n in doc["nodes"] for c in n["cards"]}
            await self.budgets.tick(doc["allocations"], groups, models)
        except Exception:
            log.exception(
                "the GiB·h book failed this pass; it runs again in %.0f s", self.gpu_idle_check_seconds
            )

    async def run(self) -> None:
        self.releases = ReleaseHistory(started=time.monotonic(), min_span=self.queue_estimate_after)
        self.cluster = Cluster(
            self._make_informer,
            self.resource_names,
            self.ledger_max_staleness,
            hub_namespaces=self.trusted_namespaces(),
        )
        hub = HubServers(
            os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api"),
            os.environ.get("JUPYTERHUB_API_TOKEN", ""),
        )
        missing = [v for v in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN") if not os.environ.get(v)]
        if missing:
            log.error(
                "%s not set: JupyterHub sets them for a service it starts (configure_hub in "
                "jupyterhub_config.py); an external service needs them, with its hub API token",
                " and ".join(missing),
            )
        self.hub_servers = hub
        try:
            self.store = ServiceStore(self.state_db)
            book = BudgetStore(self.state_db)
        except Exception as err:  # sqlite3.Error, OSError: a folder that cannot be written
            log.error(
                "cannot open the service's database %s (%s); set state_db to a writable file",
                self.state_db,
                err,
            )
            sys.exit(2)
        self.returner = IdleReturner(
            self.idle_rule,
            self.store,
            HubAPI(hub.api_url, hub.token),
            self.post_event,
            keep_seconds=self.history_retention_days * 86400,
        )
        self.budgets = BudgetKeeper(
            self.budget_rule,
            book,
            HubAPI(hub.api_url, hub.token),
            self.post_event,
            gap=max(90.0, 3 * self.gpu_idle_check_seconds),
            keep_seconds=self.history_retention_days * 86400,
        )
        connecting = asyncio.create_task(self._connect())
        await hub.poll()
        PeriodicCallback(hub.poll, self.hub_poll_seconds * 1000).start()
        PeriodicCallback(self.apply_idle_rule, self.gpu_idle_check_seconds * 1000).start()
        url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
        app = self.make_app(self.cluster, hub)
        ip, port = self.ip or url.hostname or "127.0.0.1", self.port or url.port or 80
        try:
            app.listen(port, ip, max_body_size=SERVER_MAX_BODY)  # bodies are refused as they stream in
        except (OSError, ValueError) as err:  # in use, or an address this host does not have
            log.error("cannot listen on %s:%d (%s); set --port/--ip or the service's url", ip, port, err)
            sys.exit(2)
        log.info("gpushare service listening on %s:%d", ip, port)
        await asyncio.Event().wait()
        connecting.cancel()

    def start(self) -> None:
        asyncio.run(self.run())


# ---- handlers ------------------------------------------------------------------------------


class BaseHandler(HubOAuthenticated, LimitedBody):  # type: ignore[misc]
    """Who calls, what they may see; errors as JSON (API) or a short page. A body past
    :data:`MAX_BODY_BYTES` is refused with 413 as it streams in, before the caller is known.

    The hub's login cookie (the dashboard's OAuth token) is taken on a page's navigation
    (:attr:`cookie_without_xsrf`); the API takes it only with the page's XSRF token in
    ``X-XSRFToken``, as the dashboard's own calls send it (:func:`.access.xsrf_sent`), so that a
    link or an image in a notebook an admin opens cannot call the API with the admin's cookie."""

    cookie_without_xsrf = False
    _cookie_refused = False

    def prepare(self) -> None:
        super().prepare()
        self.start_body()

    def get_current_user(self) -> dict[str, Any] | None:
        user = super().get_current_user()
        if (
            user
            and not self.cookie_without_xsrf
            and not getattr(self, "_token_authenticated", False)  # HubAuth: the cookie's
            and not xsrf_sent(self.request.headers, lambda: self.xsrf_token)
        ):
            self._cookie_refused = True
            return None
        return user  # type: ignore[no-any-return]

    def body_too_large(self, size: int, limit: int) -> None:
        said = f"the body has {size} bytes, more than {limit}; the service's requests are small JSON objects"
        self.send_error(413, exc_info=(web.HTTPError, web.HTTPError(413, said), None))

    json_errors = True
    _not_allowed: dict[str, Any] | None = None

    @property
    def service(self) -> GPUShareService:
        return self.settings["service"]  # type: ignore[no-any-return]

    @property
    def cluster(self) -> Cluster:
        return self.settings["cluster"]  # type: ignore[no-any-return]

    @property
    def hub(self) -> HubServers:
        return self.settings["hub"]  # type: ignore[no-any-return]

    def check_hub_user(self, model: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return super().check_hub_user(model)  # type: ignore[no-any-return]
        except Exception:
            self._not_allowed = model
            raise

    # Whether a notebook server's own token may call this route (api/v1/me and Keep only), and
    # whether the route answers for a hub user only (a service's token is refused).
    server_tokens = False
    users_only = False

    def who(self) -> Caller:
        """The caller (:class:`~.access.Caller`), from the token's own scopes."""
        return Caller.of(self.current_user or {})

    def is_admin(self) -> bool:
        return self.who().is_admin(self.service.admin_scope)

    def caller(self) -> dict[str, Any]:
        """The caller's model; 401 (no valid token) or 403 (no access scope, a server token on a
        route not open to it, a service on a route for users) otherwise."""
        user = self.current_user
        if user:
            who = self.who()
            if who.kind == SERVER and not self.server_tokens:
                raise web.HTTPError(403, refusal(who, "This route", self.service.admin_scope))
            if who.kind == SERVICE and self.users_only:
                raise web.HTTPError(
                    403,
                    f"this route answers for a hub user, and the token is the service {who.name!r}'s; "
                    "call it with a user's token (or from their notebook server)",
                )
            return user  # type: ignore[no-any-return]
        if self._cookie_refused:
            raise web.HTTPError(403, COOKIE_REFUSAL)
        if self._not_allowed is not None:
            raise web.HTTPError(
                403,
                f"{self._not_allowed.get('name')} may not use this service: it needs the scope "
                f"access:services!service={self.settings['service_name']}",
            )
        raise web.HTTPError(
            401,
            "no valid hub token: the token is missing, invalid or expired; send "
            "'Authorization: token <hub API token>' with a current token, or log in to the hub again",
        )

    def require(self, scope: str, what: str) -> None:
        who = self.who()
        if not who.may(scope, self.service.admin_scope):
            raise web.HTTPError(403, refusal(who, what, scope))

    def filters(self, allowed: tuple[str, ...]) -> Filters:
        try:
            return parse_query(self.request.query_arguments, allowed)
        except QueryError as err:
            raise web.HTTPError(400, str(err)) from err

    def ledger_doc(self, filters: Filters | None = None) -> dict[str, Any]:
        doc = ledger_document(
            self.cluster.report(),
            self.hub.servers,
            self.service.catalogue,
            datetime.now(UTC),
            filters or Filters(),
            stale_seconds=self.cluster.stale_for(),
            gpu_idle_after=self.service.gpu_idle_after,
        )
        if self.hub.error:  # start and activity are then the last ones read
            doc["warnings"].append(self.hub.error)
        self.hub.read_soon({(a["hub_user"], a["server"]) for a in doc["allocations"] if a["hub_user"]})
        return doc

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = (kwargs.get("exc_info") or (None, None, None))[1]
        message = (exc.log_message if isinstance(exc, web.HTTPError) else None) or self._reason
        if self.json_errors:
            self.set_header("Content-Type", "application/json; charset=UTF-8")
            self.finish(json.dumps({"status": status_code, "message": message}))
            return
        self.set_header("Content-Type", "text/html; charset=UTF-8")
        self.finish(ERROR_PAGE.format(status=status_code, message=escape(message), home=escape(hub_home())))

    def json_body(self, example: str, empty: bytes) -> Any:
        """The request's body (at most :data:`MAX_BODY_BYTES`) as JSON (``empty`` stands for no
        body); 400 saying to send ``example`` when it is not JSON."""
        raw = self.body or empty
        try:
            return json.loads(raw)
        except (ValueError, RecursionError):  # nesting deeper than the parser's stack: not ours
            raise web.HTTPError(400, f"the body is not JSON; send {example}") from None

    def send(self, doc: Any) -> None:
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(doc, indent=1))


class LedgerHandler(BaseHandler):
    def get(self) -> None:
        self.caller()
        self.require(self.service.admin_scope, "Reading the ledger")
        self.send(self.ledger_doc(self.filters(FILTER_KEYS)))


class AvailabilityHandler(BaseHandler):
    def get(self) -> None:
        self.caller()
        self.filters(())
        svc = self.service
        self.send(
            availability_document(self.cluster.ledger(), svc.catalogue, svc.node_selector, datetime.now(UTC))
        )


class MeHandler(BaseHandler):
    server_tokens = users_only = True

    async def get(self) -> None:
        user = self.caller()
        self.filters(())
        svc = self.service
        name = str(user.get("name"))
        groups = await self.hub.groups_of(name)
        allowed = tuple(s for s in svc.catalogue.slices if s.allows(groups))
        free = self.cluster.recent(
            ("availability", tuple(s.slug for s in allowed)),
            lambda: availability_document(
                self.cluster.ledger(), Catalogue(allowed, {}), svc.node_selector, datetime.now(UTC)
            ),
        )
        ledger = self.cluster.recent("ledger", self.ledger_doc)
        spawn = url_path_join(os.environ.get("JUPYTERHUB_BASE_URL", "/"), "hub/spawn", quote(name, safe=""))
        doc = me_document(ledger, name, free, spawn)
        add_queue_places(doc, self.cluster, getattr(svc, "releases", None))
        doc["budget"] = (
            self.cluster.recent(("budget", name, tuple(groups)), lambda: svc.budgets.document(name, groups))
            if svc.budget_rule.configured
            else None
        )
        self.send(add_idle_returns(doc, svc, ledger, groups, name))


def add_queue_places(doc: dict[str, Any], cluster: Cluster, releases: ReleaseHistory | None) -> None:
    """Each of the caller's pending spawns gains ``ahead`` (older pending spawns as large or
    larger, of a card model it could use) and ``estimate`` (None without history)."""
    waiting = [(f.row.since, key, f.pending.demand) for key, f in cluster.pods.items() if f.pending and f.row]
    now = time.monotonic()
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
    doc: dict[str, Any], svc: GPUShareService, ledger: dict[str, Any], groups: list[str], name: str
) -> dict[str, Any]:
    """``api/v1/me`` gains, per allocation idle on the GPU, ``idle_return`` (the action, phase,
    deadline, the words, whether Keep may be pressed); and ``returned``: the caller's slices
    stopped or parked in the last day, with the words and the way back."""
    now = int(time.time())
    mine = [a for a in ledger["allocations"] if a["hub_user"] == name]
    states = {(st.server, st.pod): st for st in svc.returner.states({"allocations": mine}, {name: groups})}
    for a in doc["allocations"]:
        st = states.get((a["server"], a["pod"]))
        a["idle_return"] = st.to_json(now) if st is not None else None
    returned = []
    for act in svc.store.returned(name, now - 86400):
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
                "at": datetime.fromtimestamp(act.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "idle_seconds": act.idle_seconds,
                "words": f"your {size} was returned after {duration_words(act.idle_seconds)} idle on "
                f"the GPU, {how}. Your files are kept: start your {size} again from the spawn page.",
            }
        )
    doc["returned"] = returned
    return doc


class KeepHandler(BaseHandler):
    """``POST api/v1/me/keep`` ``{"server": ""}``: put off the idle action of the caller's slice."""

    server_tokens = users_only = True

    def post(self) -> None:
        user = self.caller()
        self.filters(())
        name = str(user.get("name"))
        server = self._server()
        svc = self.service
        ledger = self.ledger_doc()
        mine = [a for a in ledger["allocations"] if a["hub_user"] == name and a["server"] == server]
        states = svc.returner.states({"allocations": mine}, {name: self.hub.groups.get(name, [])})
        which = f"server {server!r}" if server else "your default server"
        if not states:
            raise web.HTTPError(
                404,
                f"no GPU slice of {which} is idle on the GPU now: nothing to keep (any GPU work "
                "already resets the idle clock)",
            )
        st = states[0]
        if not st.can_keep and st.kept_until is None:
            raise web.HTTPError(409, f"the idle rule for {which} only notifies: nothing will be returned")
        now = int(time.time())
        until = max(st.deadline, now + svc.idle_rule.keep_seconds)
        if not svc.store.keep(name, server, st.stretch, until, now):
            raise web.HTTPError(
                409,
                f"Keep was already pressed once for this idle stretch of {which}; use the GPU (any "
                "work resets the idle clock), or save your work",
            )
        log.info("%s pressed Keep for %s: the idle action is put off to %d", name, which, until)
        self.send(
            {
                "server": server,
                "kept_until": datetime.fromtimestamp(until, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
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


MAX_ADD_GIB_HOURS = 1_000_000.0


async def budget_groups(svc: GPUShareService, hub: HubServers) -> dict[str, list[str]]:
    """The groups of every user the budgets' view lists: those with an active server (the last
    poll), and those in this window's book without one (read from the hub, cached)."""
    groups = dict(hub.groups)
    for user in svc.budgets.booked_users():
        if user not in groups:
            groups[user] = await hub.groups_of(user)
    return groups


class BudgetsHandler(BaseHandler):
    """``GET api/v1/budgets`` (admin scope): every user's GiB·h in the current window."""

    async def get(self) -> None:
        self.caller()
        self.require(self.service.admin_scope, "Reading every user's GPU budget")
        self.filters(())
        self.send(self.service.budgets.everyone(await budget_groups(self.service, self.hub)))


class BudgetAddHandler(BaseHandler):
    """``POST api/v1/budgets/<user>`` ``{"add_gib_hours": 20}`` (admin scope): add to a hub
    user's current window."""

    async def post(self, quoted: str) -> None:
        admin = self.caller()
        self.require(self.service.admin_scope, "Adding to a user's GPU budget")
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
        keeper.store.add(user, budget.start, amount, str(admin.get("name")), now)
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


HISTORY_QUERY = {"format": ("json", "csv"), "names": ("pseudonyms", "real")}


class HistoryHandler(BaseHandler):
    """``GET api/v1/history`` (admin scope): every slice held, for capacity planning."""

    def get(self) -> None:
        self.caller()
        self.require(self.service.admin_scope, "Reading the hub's history of slices held")
        query = self._query()
        keeper = self.service.budgets
        now = time.time()
        since = query.get("since", now - keeper.keep_seconds)
        until = query.get("until", now + 1)
        real = query.get("names") == "real"
        store = keeper.store
        if since >= until:
            raise web.HTTPError(400, "since is not before until: give a range that is not empty")
        held = store.intervals(float(since), float(until))
        if real:
            rows = history_rows(held, now)
        else:
            rows = history_rows(held, now, store.pseudonym, store.server_pseudonym)
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
                "retention_days": round(keeper.keep_seconds / 86400),
                "waited_after_seconds": WAITED_AFTER,
                "rows": rows,
            }
        )

    def _query(self) -> dict[str, Any]:
        """``format`` (json, csv), ``names`` (pseudonyms, real), ``since`` and ``until``."""
        return query_values(self, HISTORY_QUERY, ("since", "until"))


PLANNING_TEXTS = ("cards", "catalogue", "policy")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class PlanningHandler(BaseHandler):
    """``GET api/v1/planning`` (admin scope): the hub's history replayed against other card
    counts, catalogues and policies (:mod:`gpushare_hub.service.planning`), on request."""

    async def get(self) -> None:
        self.caller()
        self.require(self.service.admin_scope, "Planning from the hub's history")
        query = query_values(self, {}, ("since", "until"), PLANNING_TEXTS)
        svc = self.service
        keeper = svc.budgets
        now = time.time()
        since = query.get("since", now - keeper.keep_seconds)
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
                    None, plan_from_history, keeper.store, since, until, now, plans
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


class MetricsHandler(BaseHandler):
    async def get(self) -> None:
        self.caller()
        self.require(self.service.metrics_scope, "Reading the metrics")
        self.filters(())
        labels = pending_labels(self.cluster.pending(), self.cluster.ledger())
        svc = self.service
        configured = svc.budget_rule.configured
        budgets = svc.budgets.everyone(await budget_groups(svc, self.hub)) if configured else None
        body = render_metrics(self.ledger_doc(), self.hub.groups, svc.quota_gib_per_group, labels, budgets)
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(body)


class NotFoundHandler(BaseHandler):
    """Every path no route matches (the application's default handler): 404 for any method."""

    def get(self, *_: str) -> None:
        raise web.HTTPError(
            404,
            "no such endpoint; the API has api/v1/ledger, api/v1/availability, api/v1/me, "
            "api/v1/me/keep, api/v1/budgets, api/v1/budgets/<user>, api/v1/history and api/v1/planning",
        )

    post = put = patch = delete = head = options = get


class ToPrefixHandler(BaseHandler):
    """The service's prefix without its slash: the dashboard, the query kept (as tornado's
    ``RedirectHandler`` did; this one refuses a large body as every route does)."""

    cookie_without_xsrf = True

    def get(self) -> None:
        pairs = [
            (k, v.decode(errors="replace")) for k, vs in self.request.query_arguments.items() for v in vs
        ]
        self.redirect(url_concat(self.settings["prefix"], pairs) if pairs else self.settings["prefix"], True)


class OAuthCallbackHandler(HubOAuthCallbackHandler, BaseHandler):  # type: ignore[misc]
    """JupyterHub's OAuth callback, refusing a large body as every route does; its errors are a
    short page (it is a browser's navigation)."""

    cookie_without_xsrf = True
    json_errors = False


class DashboardHandler(BaseHandler):
    json_errors = False
    cookie_without_xsrf = True  # the page's navigation; its own calls send the XSRF token

    def get(self) -> None:
        if not self.current_user:
            if self._not_allowed is None:
                self.redirect(self.get_login_url())
                return
            self.caller()
        svc = self.service
        if not self.is_admin():
            raise web.HTTPError(
                403,
                f"The GPU slices dashboard needs the scope {svc.admin_scope} (or a hub admin's "
                "admin-ui) on the token, "
                f"which {self.current_user.get('name')}'s token does not hold. Ask a hub admin to grant it; "
                "meanwhile api/v1/availability and api/v1/me answer for you.",
            )
        filters = self.filters((*FILTER_KEYS, "refresh"))
        page = files("gpushare_hub.service").joinpath("static/dashboard.html").read_text()
        settings = {
            "refresh": filters.refresh or svc.refresh_seconds,
            "filters": {"node": filters.node, "model": filters.model, "user": filters.user},
            "user": self.current_user.get("name"),
            "home": hub_home(),
            # HubOAuth accepts the cookie on the page's own fetch() calls only with this token.
            "xsrf": self.xsrf_token.decode() if isinstance(self.xsrf_token, bytes) else self.xsrf_token,
        }
        self.set_header("Cache-Control", "no-store")
        self.finish(page.replace("/*SETTINGS*/{}", json.dumps(settings).replace("<", "\\u003c")))


ERROR_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>GPU slices: {status}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font-family:system-ui,sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem;color:#222}}
h1{{font-size:1.4rem}} .msg{{background:#fdecea;border-left:4px solid #a94442;padding:.8rem 1rem}}</style>
</head><body><h1>GPU slices: {status}</h1><p class="msg" id="gpushare-error">{message}</p>
<p><a href="{home}">Back to the hub</a></p></body></html>
"""


def hub_home() -> str:
    """The hub's home page, under the hub's base URL (JupyterHub gives it to its services)."""
    return url_path_join(os.environ.get("JUPYTERHUB_BASE_URL", "/"), "hub/home")  # type: ignore[no-any-return]


class ServiceConfigError(ValueError):
    """The service's settings cannot be used; the message names the setting and the fix."""


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s %(name)s] %(message)s")
    app = GPUShareService()
    try:
        app.initialize(argv)
    except (ServiceConfigError, CatalogueError, TraitError) as err:
        print(f"gpushare-hub-service: {err}", file=sys.stderr)
        sys.exit(2)
    app.start()
