"""``gpushare-extender``: the HTTP service kube-scheduler calls.

Endpoints (all JSON) on ``--port``, for callers that prove themselves (mutual TLS
or a bearer token, see :mod:`gpushare_hub.extender.auth`): ``POST /filter``, ``POST /prioritize``,
``POST /bind``, ``GET /inspect`` (the ledger; ``/inspect/<node>`` for one node).
On ``--metrics-port``, open: ``GET /healthz``, ``GET /readyz``, ``GET /metrics``
(Prometheus). ``--print-scheduler-config`` writes the KubeSchedulerConfiguration of
a dedicated scheduler that uses it, with its ``tlsConfig`` when given.

Run it as a sidecar of the dedicated scheduler and point the scheduler at
``http://127.0.0.1:<port>``: kube-scheduler's own leader election then decides
which replica's extender is active, and the others only keep their ledgers warm."""

# The application's rooms: .settings (every setting, and the two documents printed from them),
# .handlers (the HTTP handlers of both ports) and .serving (the servers, TLS, the run).

from __future__ import annotations

import asyncio
import logging
import sys
from typing import cast

from traitlets import default
from traitlets.config import Application

from .handlers import MAX_BODY_BYTES, make_app, make_ops_app
from .serving import config_problem, make_ops_server, make_server, serve
from .settings import ExtenderSettings

__all__ = [
    "MAX_BODY_BYTES",
    "GPUShareExtender",
    "main",
    "make_app",
    "make_ops_app",
    "make_ops_server",
    "make_server",
]

log = logging.getLogger("gpushare.extender")


class GPUShareExtender(ExtenderSettings, Application):
    name = "gpushare-extender"
    description = __doc__

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

    def start(self) -> None:
        logging.basicConfig(
            level=cast(int, self.log_level), format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        if self.print_admission_policy:
            print(self.admission_policy(), end="")
            return
        if self.print_scheduler_config:
            print(self.scheduler_config())
            return
        problem = config_problem(self)
        if problem:
            self.log.error("%s", problem)
            sys.exit(2)
        asyncio.run(serve(self, self.log))


def main(argv: list[str] | None = None) -> None:
    GPUShareExtender.launch_instance(argv)


if __name__ == "__main__":
    main()
