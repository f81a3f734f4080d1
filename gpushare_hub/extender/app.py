"""``gpushare-extender``: the HTTP service kube-scheduler calls.

Endpoints (all JSON) on ``--port``, for callers that prove themselves (mutual TLS
or a bearer token, see :mod:`gpushare_hub.extender.auth`): ``POST /filter``, ``POST /prioritize``,
``POST /bind``, ``GET /inspect`` (the ledger; ``/inspect/<node>`` for one node).
On ``--metrics-port``, open: ``GET /healthz``, ``GET /readyz``, ``GET /metrics``
(Prometheus). ``--print-scheduler-config`` writes the KubeSchedulerConfiguration of
a dedicated scheduler that uses it, with its ``tlsConfig`` when given.

Run it as a sidecar of the dedicated scheduler and point the scheduler at
``http://127.0.0.1:<port>``: kube-scheduler's own leader election then decides
which replica's extender is active, and the others only keep their ledgers warm.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import socket
import ssl
import sys
import time
from pathlib import Path
from typing import Any, cast

import tornado.web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from tornado.httpserver import HTTPServer
from traitlets import Bool, Enum, Float, Integer, List, Unicode, default
from traitlets.config import Application

from gpushare_hub.core import ResourceNames
from gpushare_hub.core.names import DRA_PRIORITIZE_VERB, DRA_SCHEDULER_NAME
from gpushare_hub.core.policy import POLICIES
from gpushare_hub.kube.kubeconfig import connection_problem
from gpushare_hub.web.bodylimit import SERVER_MAX_BODY, LimitedBody

from .admission import Identities, admission_yaml
from .auth import CallerPolicy
from .kube import Kube, make_api_client
from .leader import LeaseElector, LeaseSettings
from .schedconfig import scheduler_config_yaml
from .service import ExtenderService
from .wire import BadRequest, BindingArgs, ExtenderArgs, filter_result, priority_list

log = logging.getLogger("gpushare.extender")


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


def make_server(
    service: ExtenderService,
    prefix: str,
    tls_cert: str = "",
    tls_key: str = "",
    client_ca: str = "",
    token: str = "",
) -> HTTPServer:
    """The verbs' server; HTTPS when a certificate and key are given.

    ``client_ca``: callers may present a client certificate signed by it (required
    when there is no ``token``; the handshake refuses anyone else). ``token``:
    callers may send ``Authorization: Bearer <token>``. Neither: open.
    """
    ssl_ctx = None
    if tls_cert:
        ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_ctx.load_cert_chain(tls_cert, tls_key)
        if client_ca:
            ssl_ctx.load_verify_locations(cafile=client_ca)
            ssl_ctx.verify_mode = ssl.CERT_OPTIONAL if token else ssl.CERT_REQUIRED
    elif client_ca:
        raise ValueError("a client CA needs HTTPS: give the serving certificate and key too")
    callers = CallerPolicy(token=token, client_certs=bool(client_ca))
    # The verbs refuse a body past MAX_BODY_BYTES with 413 as it streams in; tornado's own limit,
    # which would drop the connection without an answer, is set far above it.
    return HTTPServer(
        make_app(service, prefix, None if callers.open else callers),
        ssl_options=ssl_ctx,
        max_body_size=SERVER_MAX_BODY,
    )


def make_ops_server(service: ExtenderService) -> HTTPServer:
    return HTTPServer(make_ops_app(service))


class GPUShareExtender(Application):
    name = "gpushare-extender"
    description = __doc__

    ip = Unicode("127.0.0.1", help="Address to listen on. The default suits a sidecar of the scheduler.").tag(
        config=True
    )
    port = Integer(
        32766, min=1, max=65535, help="Port of the verbs (filter, prioritize, bind) and /inspect."
    ).tag(config=True)
    metrics_ip = Unicode(
        "",
        help="""Address of the metrics port (/metrics, /healthz, /readyz); empty: the same as ip.
        Use 0.0.0.0 in a pod so that Prometheus and the kubelet's probes reach it.""",
    ).tag(config=True)
    metrics_port = Integer(
        32767,
        min=1,
        max=65535,
        help="""Port of /metrics, /healthz and /readyz, which ask for no credential, so that
        Prometheus and probes need no access to /bind.""",
    ).tag(config=True)
    tls_client_ca = Unicode(
        "",
        help="""CA file: callers of the verbs and /inspect must present a client certificate
        it signed (mutual TLS; needs tls_cert and tls_key). Use a CA that signs only these
        client certificates, e.g. the one for kube-scheduler's extender tlsConfig.""",
    ).tag(config=True)
    token_file = Unicode(
        "",
        help="""File holding a bearer token: callers of the verbs and /inspect may send
        'Authorization: Bearer <token>' instead of a client certificate. With neither this
        nor tls_client_ca, anyone who reaches the port may bind pods: only for a sidecar
        listening on 127.0.0.1 of a scheduler that is not on the host network.""",
    ).tag(config=True)
    scheduler_client_cert = Unicode(
        "",
        help="""For --print-scheduler-config: the client certificate file kube-scheduler
        presents (its extender tlsConfig.certFile), signed by tls_client_ca.""",
    ).tag(config=True)
    scheduler_client_key = Unicode(
        "", help="For --print-scheduler-config: the key of scheduler_client_cert (tlsConfig.keyFile)."
    ).tag(config=True)
    scheduler_ca = Unicode(
        "",
        help="""For --print-scheduler-config: the CA file with which kube-scheduler checks
        the extender's serving certificate (tlsConfig.caFile).""",
    ).tag(config=True)
    leader_elect = Bool(
        False,
        help="""Hold a coordination.k8s.io Lease and bind only while holding it; other
        replicas refuse bind with an error naming the leader. Needed when several replicas
        answer at once (a Deployment behind a Service); not for sidecars of a scheduler
        that runs its own leader election.""",
    ).tag(config=True)
    lease_name = Unicode("gpushare-extender", help="Name of the Lease (with leader_elect).").tag(config=True)
    lease_namespace = Unicode("kube-system", help="Namespace of the Lease (with leader_elect).").tag(
        config=True
    )
    lease_duration = Float(
        15.0, help="Seconds without renewal after which another replica may take the Lease."
    ).tag(config=True)
    lease_renew_deadline = Float(
        10.0, help="Seconds without a successful renewal after which the holder stops binding."
    ).tag(config=True)
    lease_retry_period = Float(2.0, help="Seconds between attempts to take or renew the Lease.").tag(
        config=True
    )
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
    dra_scheduler_name = Unicode(
        "",
        help=f"""For --print-scheduler-config: add a profile of this name (the chart's is
        {DRA_SCHEDULER_NAME}) for DRA pods, with a prioritize-only extender entry that packs
        their slices across nodes as binpack does (the chart's dra.scheduler: gpushare).""",
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
    admission_extender_users = List(
        Unicode(),
        default_value=list(Identities().extender),
        help="""For --print-admission-policy: the extender's identities as the API server names
        them (a service account: system:serviceaccount:<namespace>:<name>). Only these may
        write gpushare-hub.io/allocation and ALIYUN_COM_GPU_MEM_* on pods.""",
    ).tag(config=True)
    admission_plugin_users = List(
        Unicode(),
        default_value=list(Identities().plugin),
        help="""For --print-admission-policy: the device plugin's identities. Each may change
        only its own Node and the pods bound to it, as named by its service-account token.""",
    ).tag(config=True)
    admission_admin_groups = List(
        Unicode(),
        default_value=list(Identities().admin_groups),
        help="For --print-admission-policy: groups that may repair the protected annotations.",
    ).tag(config=True)
    admission_policy_users = List(
        Unicode(),
        default_value=[],
        help="""For --print-admission-policy: identities that may set the pod annotation
        gpushare-hub.io/policy while users may not (e.g. the hub's service account, when
        GPUShareSpawner writes a policy an admin chose for a profile).""",
    ).tag(config=True)
    admission_exempt_namespaces = List(
        Unicode(),
        default_value=list(Identities().exempt_namespaces),
        help="""For --print-admission-policy: namespaces whose pods may set the NVIDIA runtime's
        variables (NVIDIA_VISIBLE_DEVICES, NVIDIA_GPU_MEMORY_*, CUDA_MPS_*) and use its
        RuntimeClasses: gpushare's own, kube-system, the GPU Operator's.""",
    ).tag(config=True)
    admission_runtime_classes = List(
        Unicode(),
        default_value=list(Identities().runtime_classes),
        help="""For --print-admission-policy: RuntimeClasses that hand a container the cards its
        environment names (the GPU Operator's); only pods in the exempt namespaces may use them.""",
    ).tag(config=True)
    allow_user_policy = Bool(
        False,
        help="""For --print-admission-policy: let users choose a placement policy with the pod
        annotation gpushare-hub.io/policy (off: only the extender's identity and admins may set it).""",
    ).tag(config=True)
    print_admission_policy = Bool(
        False,
        help="Print the ValidatingAdmissionPolicies (and bindings) that refuse forged annotations, and exit.",
    ).tag(config=True)
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
        "dra-scheduler-name": "GPUShareExtender.dra_scheduler_name",
        "tls-cert": "GPUShareExtender.tls_cert",
        "tls-key": "GPUShareExtender.tls_key",
        "tls-client-ca": "GPUShareExtender.tls_client_ca",
        "token-file": "GPUShareExtender.token_file",
        "metrics-ip": "GPUShareExtender.metrics_ip",
        "metrics-port": "GPUShareExtender.metrics_port",
        "scheduler-client-cert": "GPUShareExtender.scheduler_client_cert",
        "scheduler-client-key": "GPUShareExtender.scheduler_client_key",
        "scheduler-ca": "GPUShareExtender.scheduler_ca",
        "admission-extender-user": "GPUShareExtender.admission_extender_users",
        "admission-plugin-user": "GPUShareExtender.admission_plugin_users",
        "admission-admin-group": "GPUShareExtender.admission_admin_groups",
        "admission-policy-user": "GPUShareExtender.admission_policy_users",
        "admission-exempt-namespace": "GPUShareExtender.admission_exempt_namespaces",
        "admission-runtime-class": "GPUShareExtender.admission_runtime_classes",
        "lease-name": "GPUShareExtender.lease_name",
        "lease-namespace": "GPUShareExtender.lease_namespace",
        "lease-duration": "GPUShareExtender.lease_duration",
        "lease-renew-deadline": "GPUShareExtender.lease_renew_deadline",
        "lease-retry-period": "GPUShareExtender.lease_retry_period",
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
        "print-admission-policy": (
            {"GPUShareExtender": {"print_admission_policy": True}},
            "Print the admission policies that refuse forged annotations, and exit.",
        ),
        "allow-user-policy": (
            {"GPUShareExtender": {"allow_user_policy": True}},
            "In the printed admission policy, let users set gpushare-hub.io/policy.",
        ),
        "leader-elect": (
            {"GPUShareExtender": {"leader_elect": True}},
            "Bind only while holding the Lease (several replicas answering at once).",
        ),
    }

    def names(self) -> ResourceNames:
        return ResourceNames(memory=self.resource_name, count=self.count_resource_name, unit=self.unit)

    def start(self) -> None:
        logging.basicConfig(
            level=cast(int, self.log_level), format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        if self.print_admission_policy:
            ids = Identities(
                extender=tuple(self.admission_extender_users),
                plugin=tuple(self.admission_plugin_users),
                admin_groups=tuple(self.admission_admin_groups),
                allow_user_policy=self.allow_user_policy,
                policy_setters=tuple(self.admission_policy_users),
                exempt_namespaces=tuple(self.admission_exempt_namespaces),
                runtime_classes=tuple(self.admission_runtime_classes),
            )
            print(admission_yaml(ids), end="")
            return
        if self.print_scheduler_config:
            scheme = "https" if self.tls_cert else "http"
            tls = {
                key: value
                for key, value in (
                    ("certFile", self.scheduler_client_cert),
                    ("keyFile", self.scheduler_client_key),
                    ("caFile", self.scheduler_ca),
                )
                if value
            }
            print(
                scheduler_config_yaml(
                    f"{scheme}://{self.ip}:{self.port}{self.url_prefix}",
                    self.scheduler_name,
                    self.resource_name,
                    https=bool(self.tls_cert),
                    policy=self.policy,
                    tls_config=tls or None,
                    dra_scheduler_name=self.dra_scheduler_name,
                )
            )
            return
        problem = self._config_problem()
        if problem:
            self.log.error("%s", problem)
            sys.exit(2)
        asyncio.run(self._serve())

    def _config_problem(self) -> str:
        problem = connection_problem(self.kubeconfig or None)
        if problem:
            return problem
        if bool(self.tls_cert) != bool(self.tls_key):
            return "--tls-cert and --tls-key go together; give both or neither"
        if self.tls_client_ca and not self.tls_cert:
            return "--tls-client-ca needs HTTPS: give --tls-cert and --tls-key too"
        if self.tls_cert:
            try:
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                    self.tls_cert, self.tls_key
                )
            except (OSError, ssl.SSLError) as err:
                return (
                    f"--tls-cert {self.tls_cert} / --tls-key {self.tls_key}: cannot load them as a PEM "
                    f"certificate and its key ({err}); give the tls.crt and tls.key of the extender's Secret"
                )
        if self.token_file:
            try:
                token = Path(self.token_file).read_text().strip()
            except OSError as err:
                return f"--token-file {self.token_file}: cannot read it ({err.strerror})"
            if len(token) < 16:
                return (
                    f"--token-file {self.token_file}: the token is shorter than 16 characters; "
                    "use a long random one"
                )
        return ""

    async def _serve(self) -> None:
        api = await make_api_client(self.kubeconfig or None, in_cluster=not self.kubeconfig)
        kube = Kube(api, bind_timeout=self.bind_timeout)
        service = ExtenderService(
            kube, self.policy, self.names(), self.scheduler_name, self.warn_bypass, self.stale_after
        )
        token = Path(self.token_file).read_text().strip() if self.token_file else ""
        server = make_server(service, self.url_prefix, self.tls_cert, self.tls_key, self.tls_client_ca, token)
        ops = make_ops_server(service)
        for what, srv, port, ip in (
            ("--port", server, self.port, self.ip),
            ("--metrics-port", ops, self.metrics_port, self.metrics_ip or self.ip),
        ):
            try:
                srv.listen(port, ip)
            except (OSError, ValueError) as err:  # in use, or an address this host does not have
                self.log.error("%s %d on %s: cannot listen there (%s); choose another", what, port, ip, err)
                await api.close()
                sys.exit(2)
        self.log.info(
            "gpushare-extender listening on %s:%d%s (policy %s), metrics and health on %s:%d; "
            "reading the cluster",
            self.ip,
            self.port,
            self.url_prefix,
            self.policy,
            self.metrics_ip or self.ip,
            self.metrics_port,
        )
        if not self.tls_client_ca and not token:
            self.log.warning(
                "the verbs on %s:%d are open to anyone who reaches the port, bind included; "
                "give --tls-client-ca (mutual TLS) or --token-file unless only this pod can reach it",
                self.ip,
                self.port,
            )
        elector: LeaseElector | None = None
        if self.leader_elect:
            identity = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
            elector = LeaseElector(
                api,
                LeaseSettings(
                    self.lease_name,
                    self.lease_namespace,
                    identity,
                    self.lease_duration,
                    self.lease_renew_deadline,
                    self.lease_retry_period,
                ),
                on_elected=service.resync,
            )
            service.elector = elector
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        sync = asyncio.create_task(self._start_service(service, elector))
        await stop.wait()
        sync.cancel()
        server.stop()
        ops.stop()
        await service.stop()

    async def _start_service(self, service: ExtenderService, elector: LeaseElector | None) -> None:
        attempt = 0
        while True:
            try:
                await service.start()
                self.log.info("ready: ledger holds %d GPU nodes", len(service.ledger.node_names))
                if elector is not None:
                    await elector.run()
                return
            except Exception as err:
                self.log.warning("cannot read the cluster yet (%s); retrying", err)
                await asyncio.sleep(min(10.0, 0.5 * 2**attempt))
                attempt += 1


def main(argv: list[str] | None = None) -> None:
    GPUShareExtender.launch_instance(argv)


if __name__ == "__main__":
    main()
