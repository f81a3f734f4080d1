"""The extender's HTTP handlers: the verbs kube-scheduler calls (filter, prioritize, bind, the
DRA profile's prioritize) and /inspect on the verbs' port, with the caller check and the body
limit; /healthz, /readyz and /metrics on the metrics port; and the two applications routing them."""

from __future__ import annotations

import json
import time
from typing import Any

import tornado.web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpushare_hub.core.names import DRA_PRIORITIZE_VERB
from gpushare_hub.web.bodylimit import LimitedBody

from .auth import CallerPolicy
from .service import ExtenderService
from .wire import BadRequest, BindingArgs, ExtenderArgs, filter_result, priority_list


class _Base(tornado.web.RequestHandler):
    verb = ""

    def initialize(self, service: ExtenderService, callers: CallerPolicy | None = None) -> None:
        self.service = service
        self.callers = callers
        self._t0 = time.perf_counter()

    def prepare(self) -> None:
        """Callers of the verbs and /inspect must prove themselves (mutual TLS or a bearer token)."""
        if self.callers is None:
            return
        denial = self.callers.check(
            bool(self.request.get_ssl_certificate()), self.request.headers.get("Authorization")
        )
        if denial is not None:
            self.set_header("WWW-Authenticate", "Bearer")
            self.send_json({"Error": self.callers.explain(denial)}, 401)

    def send_json(self, body: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(body))

    def on_finish(self) -> None:
        if self.verb:
            m = self.service.metrics
            m.latency.labels(self.verb).observe(time.perf_counter() - self._t0)
            m.requests.labels(self.verb, str(self.get_status())).inc()

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Unexpected failures (and 405s) answer JSON too; bad requests are answered by the verbs."""
        self.send_json({"Error": self._reason}, status_code)

    def _not_ready(self) -> bool:
        if not self.service.ready:
            self.send_json({"Error": "the extender is still reading the cluster; retry shortly"}, 503)
            return True
        return False


# A verb's body: a Pod (the API server stores at most 1.5 MiB of one) and the candidate node
# names (kube-scheduler sends names: nodeCacheCapable) of a 5,000-node cluster, about 1.3 MiB at
# the longest names. Larger bodies are refused with 413 before they are read or parsed.
MAX_BODY_BYTES = 4 * 1024 * 1024


class _Limited(LimitedBody, _Base):
    """A handler of the verbs' port: its body is read in chunks and refused with 413 past the
    limit (:mod:`gpushare_hub.web.bodylimit`). Every handler there is one, /inspect and the 404
    too: the port's server reads a body up to 1 TiB for a handler that does not stream."""

    def prepare(self) -> None:
        super().prepare()
        self.start_body()

    def body_too_large(self, size: int, limit: int) -> None:
        said = f"the body has {size} bytes, more than {limit}; no valid request is this big"
        self.send_json({"Error": f"{self.verb}: {said}" if self.verb else said}, 413)


class _Verb(_Limited):
    """A verb's handler."""


class FilterHandler(_Verb):
    verb = "filter"

    def post(self) -> None:
        try:
            args = ExtenderArgs.parse(self.body)
        except BadRequest as err:
            self.send_json({"Error": f"filter: {err}"}, 400)
            return
        if self._not_ready():
            return
        out = self.service.decisions.filter(args)
        if out.demand is not None:
            self.service.remember(args.pod)
        self.send_json(filter_result(args, out.passed, out.failed, out.unresolvable, out.error))


class PrioritizeHandler(_Verb):
    verb = "prioritize"

    def post(self) -> None:
        try:
            args = ExtenderArgs.parse(self.body)
        except BadRequest as err:
            self.send_json({"Error": f"prioritize: {err}"}, 400)
            return
        if self._not_ready():
            return
        self.send_json(priority_list(self.service.decisions.prioritize(args), args.node_names))


class DraPrioritizeHandler(_Verb):
    """The prioritize-only verb of the DRA profile (dra.scheduler: gpushare): binpack's scores for
    a pod that claims a slice, read from its claim's template; none for any other pod."""

    verb = DRA_PRIORITIZE_VERB

    async def post(self) -> None:
        try:
            args = ExtenderArgs.parse(self.body)
        except BadRequest as err:
            self.send_json({"Error": f"{self.verb}: {err}"}, 400)
            return
        if self._not_ready():
            return
        demand = await self.service.templates.demand(args.pod)
        self.send_json(
            priority_list(self.service.decisions.prioritize_dra(demand, args.node_names), args.node_names)
        )


class BindHandler(_Verb):
    verb = "bind"

    async def post(self) -> None:
        try:
            args = BindingArgs.parse(self.body)
        except BadRequest as err:
            self.send_json({"Error": f"bind: {err}"}, 400)
            return
        if self._not_ready():
            return
        self.send_json({"Error": await self.service.bind(args)})


class HealthHandler(_Base):
    def get(self) -> None:
        self.send_json({"status": "ok"})


class ReadyHandler(_Base):
    def get(self) -> None:
        informer = self.service.informer
        if self.service.ready:
            self.send_json({"status": "ready", "nodes": len(self.service.ledger.node_names)})
        elif informer.synced:
            stale = round(informer.stale_for(), 1)
            self.send_json(
                {"status": "stale", "stale_for": stale, "stale_after": self.service.stale_after}, 503
            )
        else:
            self.send_json({"status": "syncing"}, 503)


class InspectHandler(_Limited):
    def get(self, node: str | None = None) -> None:
        snap = self.service.ledger.snapshot()
        if node:
            nodes = [n for n in snap["nodes"] if n["name"] == node]
            if not nodes:
                self.send_json({"Error": f"node {node} is not a GPU-sharing node in the ledger"}, 404)
                return
            snap["nodes"] = nodes
        snap["overcommitted"] = [
            {"node": n, "uuid": u, "used": used, "units": units}
            for n, u, used, units in self.service.ledger.overcommitted()
        ]
        snap["ignored"] = [
            {"pod": r.key, "node": r.node, "reason": r.reason.value, "message": r.message()}
            for r in self.service.ledger.ignored()
        ]
        snap["ready"] = self.service.ready
        self.send_json(snap)


class MetricsHandler(_Base):
    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.service.metrics.registry))


class NotFoundHandler(_Base):
    where = ""

    def prepare(self) -> None:
        self.send_json(
            {"Error": f"no such endpoint {self.request.method} {self.request.path}; {self.where}"}, 404
        )


class VerbsNotFound(_Limited, NotFoundHandler):
    where = "this port serves /inspect and the filter, prioritize and bind verbs; /metrics, /healthz "
    where += "and /readyz are on the metrics port"

    def prepare(self) -> None:
        self.start_body()  # a body past the limit: 413 before the 404
        if not self._finished:
            NotFoundHandler.prepare(self)


class OpsNotFound(NotFoundHandler):
    where = "this port serves /metrics, /healthz and /readyz; the verbs and /inspect are on the other port"


def make_app(
    service: ExtenderService,
    prefix: str = "",
    callers: CallerPolicy | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> tornado.web.Application:
    """The verbs and /inspect. ``callers``: who may call them (``None``: anyone)."""
    p = prefix.rstrip("/")
    kw = {"service": service, "callers": callers}
    return tornado.web.Application(
        [
            (rf"{p}/filter", FilterHandler, kw),
            (rf"{p}/prioritize", PrioritizeHandler, kw),
            (rf"{p}/{DRA_PRIORITIZE_VERB}", DraPrioritizeHandler, kw),
            (rf"{p}/bind", BindHandler, kw),
            (r"/inspect", InspectHandler, kw),
            (r"/inspect/([^/]+)", InspectHandler, kw),
        ],
        default_handler_class=VerbsNotFound,
        default_handler_args=kw,
        max_body_bytes=max_body_bytes,
    )


def make_ops_app(service: ExtenderService) -> tornado.web.Application:
    """/metrics, /healthz and /readyz, open to probes and Prometheus; nothing that binds."""
    kw = {"service": service}
    return tornado.web.Application(
        [
            (r"/healthz", HealthHandler, kw),
            (r"/readyz", ReadyHandler, kw),
            (r"/metrics", MetricsHandler, kw),
        ],
        default_handler_class=OpsNotFound,
        default_handler_args=kw,
    )
