"""A small synchronous reader of the API server, for short-lived commands (the CLI).

It starts in milliseconds where the ``kubernetes`` client takes over a second to import: the
standard library's ``http.client`` and ``ssl``, one connection kept open for all calls, a
timeout on every one of them, lists read page by page (``limit``/``continue``), and objects
returned as the API server's JSON (camelCase dicts), which is what the core reads. Long-lived
components keep the asynchronous client and the informer (:mod:`gpushare_hub.kube.api`).

Credentials come from an :class:`~gpushare_hub.kube.kubeconfig.Access`: a bearer token or
token file, a client certificate (files, or PEM data written for the moment ``ssl`` loads it
into a private folder that is removed at once), basic auth, or an ``exec`` credential plugin.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
from base64 import b64encode
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from .kubeconfig import Access, KubeconfigError

CONNECT_TIMEOUT = 5.0  # seconds to open the connection (TCP and TLS)
READ_TIMEOUT = 30.0  # seconds the API server may stay silent in one answer
PAGE = 500  # objects per list call, as kubectl asks


class ApiStatusError(Exception):
    """The API server answered, with a status that is not 2xx."""

    def __init__(self, server: str, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"the API server at {server} answered {status} {reason}: {message}".rstrip(": "))
        self.server, self.status, self.reason, self.message = server, status, reason, message


class Unreachable(Exception):
    """No answer from the API server: refused, timed out, TLS failed, connection lost."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"cannot reach the API server at {server} ({reason})")
        self.server, self.reason = server, reason


def _reason(err: BaseException) -> str:
    if isinstance(err, ssl.SSLCertVerificationError):
        return f"TLS: {err.verify_message or err.reason}"
    if isinstance(err, TimeoutError):
        return "timed out"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


class _TLSConnection(http.client.HTTPSConnection):
    """An HTTPS connection that checks the certificate against ``server_name`` (the kubeconfig's
    ``tls-server-name``) instead of the host it connects to."""

    def __init__(
        self, host: str, port: int, timeout: float, context: ssl.SSLContext, server_name: str
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._tls, self._server_name = context, server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


def _write_private(folder: str, name: str, data: bytes) -> str:
    path = os.path.join(folder, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _load_client_cert(ctx: ssl.SSLContext, cert_file: str, key_file: str, cert: bytes, key: bytes) -> None:
    """``ssl`` reads a certificate chain from files only: PEM data is written for the moment it
    loads, 0600 in a 0700 folder of its own, removed before this returns."""
    try:
        if cert or key:
            import tempfile

            with tempfile.TemporaryDirectory(prefix="gpushare-kube-") as folder:
                cert_file = _write_private(folder, "client.crt", cert) if cert else cert_file
                key_file = _write_private(folder, "client.key", key) if key else key_file
                ctx.load_cert_chain(cert_file, key_file)
        else:
            ctx.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as err:
        raise KubeconfigError(f"client certificate or key {err.filename}: no such file") from None
    except (ssl.SSLError, OSError) as err:
        raise KubeconfigError(
            f"the client certificate and key cannot be loaded ({_reason(err)}); "
            "check client-certificate and client-key of the kubeconfig's user"
        ) from None


def ssl_context(access: Access, cert: bytes = b"", key: bytes = b"") -> ssl.SSLContext:
    """Trust the kubeconfig's CA only (the system's when it names none), and present the user's
    client certificate (``cert``/``key``: PEM from a credential plugin, which wins)."""
    try:
        ctx = ssl.create_default_context(
            cafile=access.ca_file or None, cadata=access.ca_data.decode("ascii") if access.ca_data else None
        )
    except FileNotFoundError:
        raise KubeconfigError(f"certificate-authority {access.ca_file}: no such file") from None
    except (ssl.SSLError, UnicodeDecodeError, OSError) as err:
        raise KubeconfigError(
            f"the cluster's certificate-authority cannot be read ({_reason(err)}); copy it again"
        ) from None
    if access.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert or key:
        _load_client_cert(ctx, "", "", cert, key)
    elif access.cert_file or access.cert_data:
        _load_client_cert(ctx, access.cert_file, access.key_file, access.cert_data, access.key_data)
    return ctx


class RestClient:
    """GET and list on one API server. Nothing happens until the first call; then the
    credential plugin runs (if the kubeconfig has one) and one connection opens, kept for
    the calls that follow. Use as a context manager, or call :meth:`close`."""

    def __init__(
        self, access: Access, connect_timeout: float = CONNECT_TIMEOUT, read_timeout: float = READ_TIMEOUT
    ) -> None:
        url = urlsplit(access.server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise KubeconfigError(f"server {access.server!r} is not an https:// URL")
        self.access = access
        self.server = access.server
        self._https = url.scheme == "https"
        self._host = url.hostname
        self._port = url.port or (443 if self._https else 80)
        self._prefix = url.path.rstrip("/")
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        self._headers: dict[str, str] | None = None
        self._ctx: ssl.SSLContext | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._used = False  # the open connection has served a call (it may have gone stale)

    def __enter__(self) -> RestClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _prepare(self) -> dict[str, str]:
        if self._headers is not None:
            return self._headers
        access = self.access
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip", "User-Agent": "gpushare-hub"}
        cert = key = b""
        token = access.token
        if access.exec is not None:
            from .execcred import run_plugin

            cred = run_plugin(access.exec, access)
            token, cert, key = cred.token or token, cred.cert_pem, cred.key_pem
        elif not token and access.token_file:
            try:
                token = Path(access.token_file).read_text().strip()
            except OSError as err:
                raise KubeconfigError(f"tokenFile {access.token_file}: {err.strerror}") from None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif access.username:
            basic = b64encode(f"{access.username}:{access.password}".encode()).decode()
            headers["Authorization"] = f"Basic {basic}"
        if self._https:
            self._ctx = ssl_context(access, cert, key)
        self._headers = headers
        return headers

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                assert self._ctx is not None
                name = self.access.tls_server_name or self._host
                conn: http.client.HTTPConnection = _TLSConnection(
                    self._host, self._port, self.connect_timeout, self._ctx, name
                )
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self.connect_timeout)
            try:
                conn.connect()
            except OSError as err:
                conn.close()
                raise Unreachable(self.server, _reason(err)) from None
            if conn.sock is not None:
                conn.sock.settimeout(self.read_timeout)
            self._conn, self._used = conn, False
        return self._conn

    def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        """The JSON at ``path`` (e.g. ``/api/v1/nodes``). Raises ApiStatusError, Unreachable,
        KubeconfigError (the credentials cannot be used) or CredentialError (the plugin failed)."""
        headers = self._prepare()
        target = self._prefix + quote(path) + (f"?{urlencode(query)}" if query else "")
        while True:
            conn = self._connection()
            reused = self._used
            try:
                conn.request("GET", target, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as err:
                self.close()
                if reused:  # the server closed an idle connection: a GET may be sent again once
                    continue
                raise Unreachable(self.server, _reason(err)) from None
            except (OSError, http.client.HTTPException) as err:
                self.close()
                raise Unreachable(self.server, _reason(err)) from None
            self._used = True
            break
        if resp.getheader("Content-Encoding") == "gzip":
            import gzip
            import zlib

            try:
                body = gzip.decompress(body)
            except (OSError, EOFError, zlib.error):
                raise Unreachable(self.server, f"the answer to GET {path} is not valid gzip") from None
        if not 200 <= resp.status <= 299:
            try:
                message = str(json.loads(body).get("message") or "")
            except (ValueError, AttributeError):
                message = body.decode(errors="replace")[:200]
            raise ApiStatusError(self.server, resp.status, resp.reason, message)
        try:
            return json.loads(body)
        except ValueError:
            raise Unreachable(self.server, f"the answer to GET {path} is not JSON") from None

    def list(
        self, path: str, query: Mapping[str, str] | None = None, page: int = PAGE
    ) -> list[dict[str, Any]]:
        """Every item of the list at ``path``, read ``page`` at a time. When a continue token
        expires (410 Gone) the list starts again from its first page, once; then it is read in one
        answer, as client-go's pager does."""
        for limit in (page, page, 0):
            items: list[dict[str, Any]] = []
            cont = ""
            try:
                while True:
                    q = {**(query or {}), **({"limit": str(limit)} if limit else {})}
                    if cont:
                        q["continue"] = cont
                    body = self.get(path, q)
                    items.extend(body.get("items") or [])
                    cont = str((body.get("metadata") or {}).get("continue") or "")
                    if not cont:
                        return items
            except ApiStatusError as err:
                if err.status != 410 or not cont:
                    raise
        raise AssertionError("unreachable: the last attempt reads the list in one answer")
