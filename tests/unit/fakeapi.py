"""A loopback HTTPS server that answers GETs as kube-apiserver does, for the tests of the CLI's
reader (tests/unit/test_kube_rest.py) and of the CLI (tests/unit/test_inspect.py). Import the
fixtures ``pki`` and ``apiserver`` into a test module to use them."""

from __future__ import annotations

import gzip
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpushare_hub.localcluster.pki import PKI

PREFIX = "/prefix"  # the server URL carries a path, as behind Rancher's proxy


class FakeApiServer:
    """401 without a known token or a client certificate of the CA; 403 when ``forbid``; lists
    (``lists``, by API path) paged by ``limit``/``continue``; gzip when asked and ``gzip``.
    Records each request as (path, query, headers, client certificate's CN)."""

    def __init__(self, pki: PKI, tokens: set[str]) -> None:
        self.requests: list[tuple[str, dict[str, list[str]], dict[str, str], str | None]] = []
        self.lists: dict[str, list[dict[str, Any]]] = {
            "/api/v1/nodes": [{"metadata": {"name": f"n{i}"}} for i in range(5)],
            "/api/v1/pods": [],
        }
        self.tokens = tokens
        self.gzip = True
        self.forbid = False
        self.expire = 0  # answer this many requests that carry a continue token with 410 Gone
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                peer = self.connection.getpeercert()  # type: ignore[attr-defined]
                cn = dict(x[0] for x in peer["subject"])["commonName"] if peer else None
                fake.requests.append((url.path, query, dict(self.headers), cn))
                auth = self.headers.get("Authorization", "")
                if not cn and auth.removeprefix("Bearer ") not in fake.tokens:
                    return self.answer(401, {"kind": "Status", "message": "Unauthorized", "code": 401})
                if fake.forbid:
                    msg = 'nodes is forbidden: User "u" cannot list resource "nodes"'
                    return self.answer(403, {"kind": "Status", "message": msg, "code": 403})
                items = fake.lists.get(url.path.removeprefix(PREFIX))
                if items is None or not url.path.startswith(PREFIX):
                    return self.answer(404, {"kind": "Status", "message": "the server could not find it"})
                if fake.expire and "continue" in query:
                    fake.expire -= 1
                    msg = "The provided continue parameter is too old to display a consistent list result."
                    return self.answer(410, {"kind": "Status", "message": msg, "code": 410})
                start = int(query.get("continue", ["0"])[0])
                end = start + int(query.get("limit", [str(len(items))])[0])
                meta = {"resourceVersion": "7", **({"continue": str(end)} if end < len(items) else {})}
                self.answer(200, {"kind": "List", "metadata": meta, "items": items[start:end]})

            def answer(self, status: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if fake.gzip and "gzip" in self.headers.get("Accept-Encoding", ""):
                    body = gzip.compress(body)
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        serving = pki.issue("apiserver", "kube-apiserver", server=True, hosts=("127.0.0.1", "api.local"))
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
        ctx.load_cert_chain(str(serving.cert), str(serving.key))
        ctx.verify_mode = ssl.CERT_OPTIONAL
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.server = f"https://127.0.0.1:{self.httpd.server_address[1]}{PREFIX}"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def apiserver(pki: PKI) -> Iterator[FakeApiServer]:
    fake = FakeApiServer(pki, tokens={"good-token"})
    thread = threading.Thread(target=fake.httpd.serve_forever, daemon=True)
    thread.start()
    yield fake
    fake.httpd.shutdown()
    fake.httpd.server_close()
