"""Serving the extender: the verbs' server (HTTPS, mutual TLS or a bearer token) and the open
metrics and health server, the settings checked before either starts, and the run itself: the
cluster read (retried until it answers), the Lease held with ``leader_elect``, a clean stop on
SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import socket
import ssl
import sys
from pathlib import Path

from tornado.httpserver import HTTPServer

from gpushare_hub.kube.kubeconfig import connection_problem
from gpushare_hub.web.bodylimit import SERVER_MAX_BODY

from .auth import CallerPolicy
from .handlers import make_app, make_ops_app
from .kube import Kube, make_api_client
from .leader import LeaseElector, LeaseSettings
from .service import ExtenderService
from .settings import ExtenderSettings


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


def config_problem(settings: ExtenderSettings) -> str:
    """What keeps these settings from serving (empty: nothing)."""
    problem = connection_problem(settings.kubeconfig or None)
    if problem:
        return problem
    if bool(settings.tls_cert) != bool(settings.tls_key):
        return "--tls-cert and --tls-key go together; give both or neither"
    if settings.tls_client_ca and not settings.tls_cert:
        return "--tls-client-ca needs HTTPS: give --tls-cert and --tls-key too"
    if settings.tls_cert:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                settings.tls_cert, settings.tls_key
            )
        except (OSError, ssl.SSLError) as err:
            return (
                f"--tls-cert {settings.tls_cert} / --tls-key {settings.tls_key}: cannot load them as a PEM "
                f"certificate and its key ({err}); give the tls.crt and tls.key of the extender's Secret"
            )
    if settings.token_file:
        try:
            token = Path(settings.token_file).read_text().strip()
        except OSError as err:
            return f"--token-file {settings.token_file}: cannot read it ({err.strerror})"
        if len(token) < 16:
            return (
                f"--token-file {settings.token_file}: the token is shorter than 16 characters; "
                "use a long random one"
            )
    return ""


async def serve(settings: ExtenderSettings, log: logging.Logger) -> None:
    """Serve until SIGTERM or SIGINT."""
    api = await make_api_client(settings.kubeconfig or None, in_cluster=not settings.kubeconfig)
    kube = Kube(api, bind_timeout=settings.bind_timeout)
    service = ExtenderService(
        kube,
        settings.policy,
        settings.names(),
        settings.scheduler_name,
        settings.warn_bypass,
        settings.stale_after,
    )
    token = Path(settings.token_file).read_text().strip() if settings.token_file else ""
    server = make_server(
        service, settings.url_prefix, settings.tls_cert, settings.tls_key, settings.tls_client_ca, token
    )
    ops = make_ops_server(service)
    for what, srv, port, ip in (
        ("--port", server, settings.port, settings.ip),
        ("--metrics-port", ops, settings.metrics_port, settings.metrics_ip or settings.ip),
    ):
        try:
            srv.listen(port, ip)
        except (OSError, ValueError) as err:  # in use, or an address this host does not have
            log.error("%s %d on %s: cannot listen there (%s); choose another", what, port, ip, err)
            await api.close()
            sys.exit(2)
    log.info(
        "gpushare-extender listening on %s:%d%s (policy %s), metrics and health on %s:%d; "
        "reading the cluster",
        settings.ip,
        settings.port,
        settings.url_prefix,
        settings.policy,
        settings.metrics_ip or settings.ip,
        settings.metrics_port,
    )
    if not settings.tls_client_ca and not token:
        log.warning(
            "the verbs on %s:%d are open to anyone who reaches the port, bind included; "
            "give --tls-client-ca (mutual TLS) or --token-file unless only this pod can reach it",
            settings.ip,
            settings.port,
        )
    elector: LeaseElector | None = None
    if settings.leader_elect:
        identity = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        elector = LeaseElector(
            api,
            LeaseSettings(
                settings.lease_name,
                settings.lease_namespace,
                identity,
                settings.lease_duration,
                settings.lease_renew_deadline,
                settings.lease_retry_period,
            ),
            on_elected=service.resync,
        )
        service.elector = elector
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sync = asyncio.create_task(start_service(service, elector, log))
    await stop.wait()
    sync.cancel()
    server.stop()
    ops.stop()
    await service.stop()


async def start_service(service: ExtenderService, elector: LeaseElector | None, log: logging.Logger) -> None:
    attempt = 0
    while True:
        try:
            await service.start()
            log.info("ready: ledger holds %d GPU nodes", len(service.ledger.node_names))
            if elector is not None:
                await elector.run()
            return
        except Exception as err:
            log.warning("cannot read the cluster yet (%s); retrying", err)
            await asyncio.sleep(min(10.0, 0.5 * 2**attempt))
            attempt += 1
