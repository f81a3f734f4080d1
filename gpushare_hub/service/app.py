"""The gpushare hub service: tornado handlers with JupyterHub OAuth, and their data sources.

``python -m gpushare_hub.service`` runs :class:`GPUShareService`, which wires the service's
rooms together (laid out as JupyterHub's application and its ``apihandlers``):

- :mod:`.settings`: the service's settings (``c.GPUShareService.<name>``); :mod:`.rules`: the
  rules built from them;
- :mod:`.sources`: what the handlers read, kept current by two watchers (the cluster's ledger,
  the hub's servers and groups);
- :mod:`.handlers`: one module per resource of the API, the dashboard and the metrics;
- below those, what they use: :mod:`.access`, :mod:`.view`, :mod:`.query`, :mod:`.metrics`,
  :mod:`.planning`, and each pass's :mod:`.enforcement`: the book
  (:mod:`gpushare_hub.accounting.book`), the idle and budget policies (:mod:`.idlepolicy`,
  :mod:`.budgets`) and the one :mod:`.enforcer` that warns, stops and parks.

This module reads the configuration, opens the book, starts the watchers and the pass, and
serves the handlers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from jupyterhub.utils import url_path_join  # type: ignore[import-untyped]
from tornado import web
from tornado.ioloop import PeriodicCallback
from traitlets import TraitError

from gpushare_hub.accounting.book import Book
from gpushare_hub.core.catalogue import CatalogueError
from gpushare_hub.core.catalogueread import read_catalogue
from gpushare_hub.core.releases import ReleaseHistory
from gpushare_hub.web.bodylimit import SERVER_MAX_BODY

from .enforcement import Enforcement
from .enforcer import EventPoster
from .handlers import handler_list
from .handlers.base import MAX_BODY_BYTES, RunningService
from .handlers.pages import NotFoundHandler, ToPrefixHandler
from .held import held_slices
from .hubapi import HubAPI
from .hubconfig import CONFIG_ENV
from .rules import ServiceConfigError, budget_rule, env_config, idle_rule, over_slice_rule
from .settings import ServiceSettings
from .sources import Cluster, HubServers, service_informer

log = logging.getLogger("gpushare.service")


class GPUShareService(ServiceSettings):
    """``python -m gpushare_hub.service``: the GPU-slices dashboard, JSON API and metrics."""

    name = "gpushare-hub-service"
    description = __doc__

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

    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        env = os.environ.get(CONFIG_ENV)
        if env:
            self.update_config(env_config(env))
        if self.config_file:
            path = Path(self.config_file)
            if not path.is_file():
                raise ServiceConfigError(
                    f"--config {self.config_file}: no such file; give a Python config file"
                )
            self.load_config_file(str(path))
        self.update_config(self.cli_config)  # the command line wins
        self.catalogue = read_catalogue(self.slices, (), self.resource_names)
        self.idle_rule = idle_rule(self, self.catalogue)
        self.budget_rule = budget_rule(self)
        self.over_slice_rule = over_slice_rule(self)

    _planning_lock: asyncio.Lock | None = None

    @property
    def planning_lock(self) -> asyncio.Lock:
        """Held while api/v1/planning computes: one plan at a time."""
        if self._planning_lock is None:
            self._planning_lock = asyncio.Lock()
        return self._planning_lock

    # ---- wiring --------------------------------------------------------------------------------
    def _make_informer(self) -> Any:
        return service_informer(self._api, self.resource_names, self.releases)

    def make_app(self, cluster: Cluster, hub: HubServers) -> web.Application:
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpushare/")
        service: RunningService = self  # all the handlers read of it
        settings: dict[str, Any] = {
            "service": service,
            "cluster": cluster,
            "hub": hub,
            "prefix": prefix,
            "service_name": os.environ.get("JUPYTERHUB_SERVICE_NAME", "gpushare"),
            "cookie_secret": os.urandom(32),
            "max_body_bytes": MAX_BODY_BYTES,
        }
        routes: list[Any] = [(url_path_join(prefix, path), handler) for path, handler in handler_list()]
        routes.append((prefix.rstrip("/"), ToPrefixHandler))
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
        """One pass of the book and the policies, on fresh figures only (:mod:`.enforcement`)."""
        if self.cluster.ledger() is None:  # the watch is failing: never act on old figures
            return
        held = held_slices(self.cluster.report(), self.hub_servers.servers)
        groups = dict(self.hub_servers.groups)
        for user in {s.user for s in held if s.user} - set(groups):
            groups[user] = await self.hub_servers.groups_of(user)  # started since the last poll
        await self.enforcement.run_pass(held, groups)

    def open_book(self, hub: HubAPI | None, post_event: EventPoster | None = None) -> Enforcement:
        """Open the book (``state_db``) and wire the policies and the enforcer to it and ``hub``."""
        e = Enforcement(
            Book(self.state_db),
            self.idle_rule,
            self.budget_rule,
            hub,
            post_event,
            check_seconds=self.gpu_idle_check_seconds,
            retention_days=self.history_retention_days,
            over_slice=self.over_slice_rule,
        )
        self.enforcement, self.book, self.idle, self.budgets = e, e.book, e.idle, e.budgets
        self.over = e.over
        return e

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
            self.open_book(HubAPI(hub.api_url, hub.token), self.post_event)
        except Exception as err:  # sqlite3.Error, OSError: a folder that cannot be written
            log.error(
                "cannot open the service's database %s (%s); set state_db to a writable file",
                self.state_db,
                err,
            )
            sys.exit(2)
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


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname)s %(asctime)s %(name)s] %(message)s")
    app = GPUShareService()
    try:
        app.initialize(argv)
    except (ServiceConfigError, CatalogueError, TraitError) as err:
        print(f"gpushare-hub-service: {err}", file=sys.stderr)
        sys.exit(2)
    app.start()
