"""A loopback HTTPS server that answers as kube-apiserver does (GET, list, merge-patch PATCH,
POST), for the tests of the REST client (tests/unit/test_kube_rest.py), of the CLI
(tests/unit/test_inspect.py) and of the device plugin's API calls (tests/unit/test_plugin.py).
Import the fixtures ``pki`` and ``apiserver`` into a test module to use them."""

from __future__ import annotations

import gzip
import json
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpushare_hub.localcluster.pki import PKI

PREFIX = "/prefix"  # the server URL carries a path, as behind Rancher's proxy


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: a null removes the key, a dict merges into a dict, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def field_value(obj: dict[str, Any], dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def selected(obj: dict[str, Any], selector: str) -> bool:
    """A fieldSelector of ``a.b=c`` terms joined by commas, as the API server reads it."""
    terms = [t.split("=", 1) for t in selector.split(",") if t]
    return all(field_value(obj, key) == value for key, value in terms)


class FakeApiServer:
    """401 without a known token or a client certificate of the CA; 403 when ``forbid``; lists
    (``lists``, by API path) paged by ``limit``/``continue`` and filtered by ``fieldSelector``;
    objects (``objects``, by API path) read, merge-patched (``.../status`` patches the status;
    a ``metadata.uid`` that differs is a 409) and created by POST into a list (``generateName``
    honoured); gzip when asked and ``gzip``. Records each request as (path, query, headers, client
    certificate's CN), each PATCH and POST as (method, path, Content-Type, body), and the client's
    port of each request in ``ports`` (one per connection). ``close_after``: close the connection
    after each answer without saying so, as a server does with an idle one; ``delay``: seconds
    to wait before each answer."""

    def __init__(self, pki: PKI, tokens: set[str]) -> None:
        self.requests: list[tuple[str, dict[str, list[str]], dict[str, str], str | None]] = []
        self.writes: list[tuple[str, str, str, Any]] = []
        self.ports: list[int] = []
        self.objects: dict[str, dict[str, Any]] = {}
        self.close_after = False
        self.delay = 0.0
        self.lists: dict[str, list[dict[str, Any]]] = {
            "/api/v1/nodes": [{"metadata": {"name": f"n{i}"}} for i in range(5)],
            "/api/v1/pods": [],
        }
        self.tokens = tokens
        self.gzip = True
        self.forbid = False
        self.expire = 0  # answer this many requests that carry a continue token with 410 Gone
        self.gone = False  # answer every list with 410 Gone, first pages included
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def refused(self) -> bool:
                """Record the request; answer 401 or 403 (and say so) when it is not allowed."""
                url = urlsplit(self.path)
                peer = self.connection.getpeercert()  # type: ignore[attr-defined]
                cn = dict(x[0] for x in peer["subject"])["commonName"] if peer else None
                fake.requests.append((url.path, parse_qs(url.query), dict(self.headers), cn))
                fake.ports.append(self.client_address[1])
                auth = self.headers.get("Authorization", "")
                if not cn and auth.removeprefix("Bearer ") not in fake.tokens:
                    self.answer(401, {"kind": "Status", "message": "Unauthorized", "code": 401})
                    return True
                if fake.forbid:
                    msg = 'nodes is forbidden: User "u" cannot list resource "nodes"'
                    self.answer(403, {"kind": "Status", "message": msg, "code": 403})
                    return True
                return False

            def not_found(self) -> None:
                self.answer(404, {"kind": "Status", "message": "the server could not find it", "code": 404})

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                if self.refused():
                    return
                path = url.path.removeprefix(PREFIX)
                if url.path.startswith(PREFIX) and path in fake.objects:
                    return self.answer(200, fake.objects[path])
                items = fake.lists.get(path)
                if items is None or not url.path.startswith(PREFIX):
                    return self.not_found()
                if "fieldSelector" in query:
                    items = [i for i in items if selected(i, query["fieldSelector"][0])]
                if fake.gone or (fake.expire and "continue" in query):
                    fake.expire -= 0 if fake.gone else 1
                    msg = "The provided continue parameter is too old to display a consistent list result."
                    return self.answer(410, {"kind": "Status", "message": msg, "code": 410})
                start = int(query.get("continue", ["0"])[0])
                end = start + int(query.get("limit", [str(len(items))])[0])
                meta = {"resourceVersion": "7", **({"continue": str(end)} if end < len(items) else {})}
                self.answer(200, {"kind": "List", "metadata": meta, "items": items[start:end]})

            def body(self, method: str) -> Any:
                doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                path = urlsplit(self.path).path
                fake.writes.append((method, path.removeprefix(PREFIX), self.headers["Content-Type"], doc))
                return doc

            def do_PATCH(self) -> None:
                patch = self.body("PATCH")
                if self.refused():
                    return
                if self.headers["Content-Type"] != "application/merge-patch+json":
                    return self.answer(415, {"kind": "Status", "message": "unsupported media type"})
                path = urlsplit(self.path).path.removeprefix(PREFIX)
                status = path.endswith("/status")
                obj = fake.objects.get(path.removesuffix("/status"))
                if obj is None:
                    return self.not_found()
                uid = (patch.get("metadata") or {}).get("uid")
                if uid is not None and uid != obj["metadata"].get("uid"):
                    msg = f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                    return self.answer(409, {"kind": "Status", "message": msg, "code": 409})
                if status:  # the status subresource changes the status only, as the API server has it
                    obj["status"] = merge_patch(obj.get("status"), patch.get("status"))
                else:
                    patched = merge_patch(obj, {k: v for k, v in patch.items() if k != "status"})
                    obj.clear()
                    obj.update(patched)
                self.answer(200, obj)

            def do_POST(self) -> None:
                doc = self.body("POST")
                if self.refused():
                    return
                items = fake.lists.setdefault(urlsplit(self.path).path.removeprefix(PREFIX), [])
                meta = doc.setdefault("metadata", {})
                meta.setdefault("name", f"{meta.pop('generateName', '')}{len(items)}")
                items.append(doc)
                self.answer(201, doc)

            def answer(self, status: int, doc: Any) -> None:
                if fake.delay:
                    time.sleep(fake.delay)
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                if fake.gzip and "gzip" in self.headers.get("Accept-Encoding", ""):
                    body = gzip.compress(body)
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                if fake.close_after:
                    self.close_connection = True

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
