"""A small synchronous client of the API server, for the CLI and the device plugin.

It starts in milliseconds where the ``kubernetes`` client takes over a second to import: the
standard library's ``http.client`` and ``ssl``, connections kept open for the calls that follow,
a timeout on every call, lists read page by page (``limit``/``continue``), merge patches and
creates, and objects sent and returned as the API server's JSON (camelCase dicts), which is what
the core reads. The extender, the spawner
and the hub service keep the asynchronous client and the informer (:mod:`gpushare_hub.kube.api`).

Credentials come from an :class:`~gpushare_hub.kube.kubeconfig.Access`: a bearer token or
token file, a client certificate (files, or PEM data written for the moment ``ssl`` loads it
into a private folder that is removed at once), basic auth, or an ``exec`` credential plugin.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from base64 import b64encode
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

from .kubeconfig import Access, KubeconfigError
from .restconn import (
    CLOSED_BY_SERVER,
    ApiStatusError,
    TLSConnection,
    Unreachable,
    dropped,
    reason_of,
    ssl_context,
)

CONNECT_TIMEOUT = 5.0  # seconds to open the connection (TCP and TLS)
READ_TIMEOUT = 30.0  # seconds the API server may stay silent in one answer
PAGE = 500  # objects per list call, as kubectl asks
KEEP_IDLE = 4  # idle connections kept for later requests (one per thread that calls at once)
TOKEN_REREAD = 60.0  # seconds between readings of a token file, as client-go has it
MERGE_PATCH = "application/merge-patch+json"

__all__ = ["MERGE_PATCH", "ApiStatusError", "RestClient", "Unreachable"]


class RestClient:
    """Requests to one API server. Nothing happens until the first call; then the credential
    plugin runs (if the kubeconfig has one) and a connection opens, kept for the calls that
    follow. Use as a context manager, or call :meth:`close`.

    Safe to share between threads (the device plugin's gRPC workers and its usage loop): each
    request takes a connection of its own from a small pool of idle ones (or opens one) and puts
    it back when the answer is read, so one thread's slow call never holds up another's. A
    connection the server has closed while idle is seen before it is used; a GET that still
    finds its kept connection closed is sent again once on a new one, never a PATCH or a POST.

    A token read from a file (the pod's service account, a kubeconfig's tokenFile) is read again
    every :data:`TOKEN_REREAD` seconds, since the kubelet rotates it; when the server answers 401
    to such a token or to an exec plugin's credential, the credential is fetched once more and
    the request sent again (a 401 request was not carried out)."""

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
        self._lock = threading.Lock()  # guards the credentials and the pool
        self._headers: dict[str, str] | None = None
        self._token_read = 0.0  # time.monotonic() when the token file was last read
        self._ctx: ssl.SSLContext | None = None
        self._idle: list[http.client.HTTPConnection] = []  # connections that served a call
        self._generation = 0  # bumped by close() and new credentials: older connections are not kept

    def __enter__(self) -> RestClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the idle connections; one in use now is closed when its answer is read."""
        with self._lock:
            idle, self._idle = self._idle, []
            self._generation += 1
        for conn in idle:
            conn.close()

    def _renewable(self) -> bool:
        """Can the credential be fetched again (an exec plugin, a token file)?"""
        return self.access.exec is not None or self._token_file_renews()

    def _token_file_renews(self) -> bool:
        return self.access.exec is None and not self.access.token and bool(self.access.token_file)

    def _read_token_file(self) -> str:
        try:
            token = Path(self.access.token_file).read_text().strip()
        except OSError as err:
            raise KubeconfigError(f"tokenFile {self.access.token_file}: {err.strerror}") from None
        self._token_read = time.monotonic()
        return token

    def _prepare(self) -> dict[str, str]:
        """The headers of a request: read (or run) the credentials the first time, read the
        token file again when :data:`TOKEN_REREAD` has passed."""
        with self._lock:
            if self._headers is None:
                self._headers = self._credentials()
            elif self._token_file_renews() and time.monotonic() - self._token_read >= TOKEN_REREAD:
                try:
                    token = self._read_token_file()
                except KubeconfigError:  # mid-rotation: the token we have may still be good
                    pass
                else:
                    self._headers = {**self._headers, "Authorization": f"Bearer {token}"}
            return self._headers

    def _credentials(self) -> dict[str, str]:
        access = self.access
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip", "User-Agent": "gpushare-hub"}
        cert = key = b""
        token = access.token
        if access.exec is not None:
            from .execcred import run_plugin

            cred = run_plugin(access.exec, access)
            token, cert, key = cred.token or token, cred.cert_pem, cred.key_pem
        elif not token and access.token_file:
            token = self._read_token_file()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        elif access.username:
            basic = b64encode(f"{access.username}:{access.password}".encode()).decode()
            headers["Authorization"] = f"Basic {basic}"
        if self._https:
            self._ctx = ssl_context(access, cert, key)
        return headers

    def _renew(self) -> None:
        """Forget the credentials (and the connections made with them): the next request
        reads the token file again or runs the exec plugin again."""
        with self._lock:
            self._headers = None
            idle, self._idle = self._idle, []
            self._generation += 1
        for conn in idle:
            conn.close()

    def _connect(self) -> http.client.HTTPConnection:
        if self._https:
            assert self._ctx is not None
            name = self.access.tls_server_name or self._host
            conn: http.client.HTTPConnection = TLSConnection(
                self._host, self._port, self.connect_timeout, self._ctx, name
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self.connect_timeout)
        try:
            conn.connect()
        except OSError as err:
            conn.close()
            raise Unreachable(self.server, reason_of(err)) from None
        if conn.sock is not None:
            conn.sock.settimeout(self.read_timeout)
        return conn

    def _checkout(self) -> tuple[http.client.HTTPConnection, bool, int]:
        """A connection for one request, whether it served an earlier one, and its generation."""
        with self._lock:
            generation = self._generation
            while self._idle:
                conn = self._idle.pop()
                if not dropped(conn):
                    return conn, True, generation
                conn.close()
        return self._connect(), False, generation

    def _checkin(self, conn: http.client.HTTPConnection, generation: int) -> None:
        with self._lock:
            if conn.sock is not None and generation == self._generation and len(self._idle) < KEEP_IDLE:
                self._idle.append(conn)
                return
        conn.close()

    def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        """The JSON at ``path`` (e.g. ``/api/v1/nodes``). Raises ApiStatusError, Unreachable,
        KubeconfigError (the credentials cannot be used) or CredentialError (the plugin failed)."""
        return self.request("GET", path, query)

    def patch_merge(self, path: str, body: Mapping[str, Any]) -> Any:
        """Apply a JSON merge patch (RFC 7386) to the object at ``path``; its new JSON."""
        return self.request("PATCH", path, body=body, content_type=MERGE_PATCH)

    def post(self, path: str, body: Mapping[str, Any]) -> Any:
        """Create ``body`` in the collection at ``path``; the created object's JSON."""
        return self.request("POST", path, body=body)

    def request(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        """Send ``method`` to ``path`` with ``body`` as JSON; the answer's JSON. Raises
        ApiStatusError (not 2xx), Unreachable, KubeconfigError or CredentialError, as :meth:`get`."""
        target = self._prefix + quote(path) + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        renewed = False
        while True:
            headers = self._prepare()
            if data is not None:
                headers = {**headers, "Content-Type": content_type}
            conn, reused, generation = self._checkout()
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                answer = resp.read()
            except CLOSED_BY_SERVER as err:
                conn.close()
                # The server closed a kept connection as the request went out: a GET may be sent
                # again once on a new one; anything else may have been carried out already.
                if reused and method == "GET":
                    continue
                raise Unreachable(self.server, reason_of(err)) from None
            except (OSError, http.client.HTTPException) as err:
                conn.close()
                raise Unreachable(self.server, reason_of(err)) from None
            self._checkin(conn, generation)
            if resp.status == 401 and not renewed and self._renewable():
                self._renew()
                renewed = True
                continue
            break
        if resp.getheader("Content-Encoding") == "gzip":
            import gzip
            import zlib

            try:
                answer = gzip.decompress(answer)
            except (OSError, EOFError, zlib.error):
                raise Unreachable(self.server, f"the answer to {method} {path} is not valid gzip") from None
        if not 200 <= resp.status <= 299:
            try:
                message = str(json.loads(answer).get("message") or "")
            except (ValueError, AttributeError):
                message = answer.decode(errors="replace")[:200]
            raise ApiStatusError(self.server, resp.status, resp.reason, message)
        try:
            return json.loads(answer)
        except ValueError:
            raise Unreachable(self.server, f"the answer to {method} {path} is not JSON") from None

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
                    if not isinstance(body, dict) or not isinstance(body.get("items") or [], list):
                        raise Unreachable(self.server, f"the answer to GET {path} is not a list")
                    items.extend(body.get("items") or [])
                    cont = str((body.get("metadata") or {}).get("continue") or "")
                    if not cont:
                        return items
            except ApiStatusError as err:
                if err.status != 410 or not cont:
                    raise
        raise AssertionError("unreachable: the last attempt reads the list in one answer")
