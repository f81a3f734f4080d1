"""The connection under :class:`~gpushare_hub.kube.rest.RestClient`: its two errors, the TLS
context (the cluster's CA, a client certificate from files or PEM data written for the moment
``ssl`` loads it into a private folder that is removed at once), the check of a kept
connection the server may have closed, and what such a connection fails with."""

from __future__ import annotations

import http.client
import os
import select
import ssl

from .kubeconfig import Access, KubeconfigError

CONNECT_TIMEOUT = 5.0  # seconds to open the connection (TCP and TLS)
READ_TIMEOUT = 30.0  # seconds the API server may stay silent in one answer
PAGE = 500  # objects per list call, as kubectl asks
KEEP_IDLE = 4  # idle connections kept for later requests (one per thread that calls at once)
TOKEN_REREAD = 60.0  # seconds between readings of a token file, as client-go has it
MERGE_PATCH = "application/merge-patch+json"


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


def reason_of(err: BaseException) -> str:
    if isinstance(err, ssl.SSLCertVerificationError):
        return f"TLS: {err.verify_message or err.reason}"
    if isinstance(err, TimeoutError):
        return "timed out"
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


# What a request on a connection the server has closed fails with: no answer at all, a reset, a
# broken pipe, or (TLS) an end of file while the request is written.
CLOSED_BY_SERVER = (
    http.client.RemoteDisconnected,
    ConnectionResetError,
    BrokenPipeError,
    ssl.SSLEOFError,
    ssl.SSLZeroReturnError,
)


def dropped(conn: http.client.HTTPConnection) -> bool:
    """Has the server closed this idle connection (or sent something unasked)? Then it is not
    used again: a request sent on it would fail, or be answered by what is already waiting."""
    if conn.sock is None:
        return True
    try:  # poll, not select: select() refuses descriptors from 1024 on, which a busy process has
        ready = select.poll()
        ready.register(conn.sock, select.POLLIN)
        return bool(ready.poll(0))
    except (OSError, ValueError):
        return True


class TLSConnection(http.client.HTTPSConnection):
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
            f"the client certificate and key cannot be loaded ({reason_of(err)}); "
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
            f"the cluster's certificate-authority cannot be read ({reason_of(err)}); copy it again"
        ) from None
    if access.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cert or key:
        _load_client_cert(ctx, "", "", cert, key)
    elif access.cert_file or access.cert_data:
        _load_client_cert(ctx, access.cert_file, access.key_file, access.cert_data, access.key_data)
    return ctx
