"""``gpushare-extender``: the HTTP service kube-scheduler calls.

Endpoints (all JSON): ``POST /filter``, ``POST /prioritize``, ``POST /bind``,
``GET /healthz``, ``GET /readyz``, ``GET /inspect`` (the ledger; ``/inspect/<node>``
for one node), ``GET /metrics`` (Prometheus). ``--print-scheduler-config``
writes the KubeSchedulerConfiguration of a dedicated scheduler that uses it.

Run it as a sidecar of the dedicated scheduler and point the scheduler at
``http://127.0.0.1:<port>``: kube-scheduler's own leader election then decides
which replica's extender is active, and the others only keep their ledgers warm.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import ssl
import sys
import time
from typing import Any, cast

import tornado.web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from tornado.httpserver import HTTPServer
from traitlets import Bool, Enum, Float, Integer, Unicode, default
from traitlets.config import Application

from gpushare_hub.core import ResourceNames
from gpushare_hub.core.policy import POLICIES

from .kube import Kube, make_api_client
from .schedconfig import scheduler_config_yaml
from .service import ExtenderService
from .wire import BadRequest, BindingArgs, ExtenderArgs, filter_result, priority_list

log = logging.getLogger("gpushare.extender")


class _Base(tornado.web.RequestHandler):
    verb = ""

    def initialize(self, service: ExtenderService) -> None:
        self.service = service
        self._t0 = time.perf_counter()

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


class FilterHandler(_Base):
    verb = "filter"

    def post(self) -> None:
        try:
            args = ExtenderArgs.parse(self.request.body)
        except BadRequest as err:
            self.send_json({"Error": f"filter: {err}"}, 400)
            return
        if self._not_ready():
            return
        out = self.service.decisions.filter(args)
        if out.demand is not None:
            self.service.remember(args.pod)
        self.send_json(filter_result(args, out.passed, out.failed, out.unresolvable, out.error))


class PrioritizeHandler(_Base):
    verb = "prioritize"

    def post(self) -> None:
        try:
            args = ExtenderArgs.parse(self.request.body)
        except BadRequest as err:
            self.send_json({"Error": f"prioritize: {err}"}, 400)
            return
        if self._not_ready():
            return
        self.send_json(priority_list(self.service.decisions.prioritize(args), args.node_names))


class BindHandler(_Base):
    verb = "bind"

    async def post(self) -> None:
        try:
            args = BindingArgs.parse(self.request.body)
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


class InspectHandler(_Base):
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
        snap["ready"] = self.service.ready
        self.send_json(snap)


class MetricsHandler(_Base):
    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.service.metrics.registry))


class NotFoundHandler(_Base):
    def prepare(self) -> None:
        self.send_json(
            {
                "Error": f"no such endpoint {self.request.method} {self.request.path}; "
                "see /healthz, /readyz, /inspect, /metrics and the filter, "
                "prioritize and bind verbs"
            },
            404,
        )


def make_app(service: ExtenderService, prefix: str = "") -> tornado.web.Application:
    p = prefix.rstrip("/")
    kw = {"service": service}
    return tornado.web.Application(
        [
            (rf"{p}/filter", FilterHandler, kw),
            (rf"{p}/prioritize", PrioritizeHandler, kw),
            (rf"{p}/bind", BindHandler, kw),
            (r"/healthz", HealthHandler, kw),
            (r"/readyz", ReadyHandler, kw),
            (r"/inspect", InspectHandler, kw),
            (r"/inspect/([^/]+)", InspectHandler, kw),
            (r"/metrics", MetricsHandler, kw),
        ],
        default_handler_class=NotFoundHandler,
        default_handler_args=kw,
    )


def make_server(service: ExtenderService, prefix: str, tls_cert: str = "", tls_key: str = "") -> HTTPServer:
    """The extender's HTTP server; HTTPS when a certificate and key are given."""
    ssl_ctx = None
    if tls_cert:
        ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_ctx.load_cert_chain(tls_cert, tls_key)
    return HTTPServer(make_app(service, prefix), ssl_options=ssl_ctx)


class GPUShareExtender(Application):
    name = "gpushare-extender"
    description = __doc__

    ip = Unicode("127.0.0.1", help="Address to listen on. The default suits a sidecar of the scheduler.").tag(
        config=True
    )
    port = Integer(32766, help="Port to listen on.").tag(config=True)
    url_prefix = Unicode(
        "/gpushare-scheduler",
        help="""Path prefix of the filter, prioritize and bind
        verbs; kube-scheduler's urlPrefix is http(s)://<ip>:<port><url_prefix>.""",
    ).tag(config=True)
    policy = Enum(
        sorted(POLICIES),
        default_value="binpack",
        help="""Default placement policy:
        binpack (fullest card that fits, on the fullest node), spread (emptiest card) or fgd
        (fragmentation-aware). A pod may choose another with the annotation gpushare-hub.io/policy.""",
    ).tag(config=True)
    resource_name = Unicode("aliyun.com/gpu-mem", help="Extended resource counting GPU memory.").tag(
        config=True
    )
    count_resource_name = Unicode("aliyun.com/gpu-count", help="Extended resource counting whole cards.").tag(
        config=True
    )
    unit = Enum(["GiB", "MiB"], default_value="GiB", help="Unit of one resource_name unit.").tag(config=True)
    scheduler_name = Unicode(
        "gpushare-scheduler",
        help="""Name of the dedicated scheduler profile; pods
        placed by any other scheduler get a Warning event saying what to change.""",
    ).tag(config=True)
    tls_cert = Unicode("", help="TLS certificate file; serve HTTPS when set (with tls_key).").tag(config=True)
    tls_key = Unicode("", help="TLS private key file.").tag(config=True)
    kubeconfig = Unicode("", help="Kubeconfig file; empty means in-cluster (service account).").tag(
        config=True
    )
    stale_after = Float(
        30.0,
        help="""Seconds a watch on the API server may fail before /readyz answers 503 (the
        ledger may be out of date); it answers 200 again once the watches recover.""",
    ).tag(config=True)
    bind_timeout = Float(
        4.0,
        help="""Seconds the extender waits for the API server to answer a Binding (and a pod
        read at bind). Keep it below kube-scheduler's httpTimeout for the extender (5s in the
        generated configuration). An unanswered Binding keeps its card reserved until the
        pod is read back.""",
    ).tag(config=True)
    warn_bypass = Bool(True, help="Emit a Warning event for pods that bypassed the dedicated scheduler.").tag(
        config=True
    )
    print_scheduler_config = Bool(
        False,
        help="Print a KubeSchedulerConfiguration for a dedicated scheduler using this extender, and exit.",
    ).tag(config=True)

    @default("log_level")
    def _log_level_default(self) -> int:
        return logging.INFO

    aliases = {  # noqa: RUF012 - traitlets reads these class attributes
        "ip": "GPUShareExtender.ip",
        "port": "GPUShareExtender.port",
        "url-prefix": "GPUShareExtender.url_prefix",
        "policy": "GPUShareExtender.policy",
        "resource-name": "GPUShareExtender.resource_name",
        "count-resource-name": "GPUShareExtender.count_resource_name",
        "unit": "GPUShareExtender.unit",
        "scheduler-name": "GPUShareExtender.scheduler_name",
        "tls-cert": "GPUShareExtender.tls_cert",
        "tls-key": "GPUShareExtender.tls_key",
        "kubeconfig": "GPUShareExtender.kubeconfig",
        "stale-after": "GPUShareExtender.stale_after",
        "bind-timeout": "GPUShareExtender.bind_timeout",
        "log-level": "Application.log_level",
    }
    flags = {  # noqa: RUF012
        "print-scheduler-config": (
            {"GPUShareExtender": {"print_scheduler_config": True}},
            "Print the KubeSchedulerConfiguration and exit.",
        ),
        "no-warn-bypass": ({"GPUShareExtender": {"warn_bypass": False}}, "Do not emit bypass warnings."),
    }

    def names(self) -> ResourceNames:
        return ResourceNames(memory=self.resource_name, count=self.count_resource_name, unit=self.unit)

    def start(self) -> None:
        logging.basicConfig(
            level=cast(int, self.log_level), format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        if self.print_scheduler_config:
            scheme = "https" if self.tls_cert else "http"
            print(
                scheduler_config_yaml(
                    f"{scheme}://{self.ip}:{self.port}{self.url_prefix}",
                    self.scheduler_name,
                    self.resource_name,
                    https=bool(self.tls_cert),
                    policy=self.policy,
                )
            )
            return
        if bool(self.tls_cert) != bool(self.tls_key):
            self.log.error("--tls-cert and --tls-key go together; give both or neither")
            sys.exit(2)
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        kube = Kube(
            await make_api_client(self.kubeconfig or None, in_cluster=not self.kubeconfig),
            bind_timeout=self.bind_timeout,
        )
        service = ExtenderService(
            kube, self.policy, self.names(), self.scheduler_name, self.warn_bypass, self.stale_after
        )
        server = make_server(service, self.url_prefix, self.tls_cert, self.tls_key)
        server.listen(self.port, self.ip)
        self.log.info(
            "gpushare-extender listening on %s:%d%s (policy %s); reading the cluster",
            self.ip,
            self.port,
            self.url_prefix,
            self.policy,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        sync = asyncio.create_task(self._start_service(service))
        await stop.wait()
        sync.cancel()
        server.stop()
        await service.stop()

    async def _start_service(self, service: ExtenderService) -> None:
        attempt = 0
        while True:
            try:
                await service.start()
                self.log.info("ready: ledger holds %d GPU nodes", len(service.ledger.node_names))
                return
            except Exception as err:
                self.log.warning("cannot read the cluster yet (%s); retrying", err)
                await asyncio.sleep(min(10.0, 0.5 * 2**attempt))
                attempt += 1


def main(argv: list[str] | None = None) -> None:
    GPUShareExtender.launch_instance(argv)


if __name__ == "__main__":
    main()
