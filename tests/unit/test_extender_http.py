"""The extender's HTTP API on loopback (no Kubernetes behind it): status codes, messages, fuzz."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tornado.httpserver import HTTPServer

from gpushare_hub.extender.service import ExtenderService
from gpushare_hub.extender.serving import make_ops_server, make_server
from gpushare_hub.localcluster.pki import PKI, Credential
from gpushare_hub.localcluster.processes import free_port
from tests.objects import read_node

from .helpers import node_obj, pod_obj

PREFIX = "/gpushare-scheduler"


@contextlib.contextmanager
def serving(
    service: ExtenderService, tls_cert: str = "", tls_key: str = "", client_ca: str = "", token: str = ""
) -> Iterator[int]:
    """The extender's own server (make_server) on a free port, in a thread; yields the port."""
    with serving_any(lambda: make_server(service, PREFIX, tls_cert, tls_key, client_ca, token)) as port:
        yield port


@contextlib.contextmanager
def serving_any(make: Callable[[], HTTPServer]) -> Iterator[int]:
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        make().listen(port, "127.0.0.1")
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(5)
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[int, ExtenderService]]:
    service = ExtenderService(kube=None)
    for name in ("gpu-1", "gpu-2"):
        service.ledger.observe_node(read_node(node_obj(name)))
    service.informer.synced = True
    with serving(service) as port:
        yield port, service


@pytest.fixture(scope="module")
def ops(server: tuple[int, ExtenderService]) -> Iterator[int]:
    """The metrics port of the same service."""
    with serving_any(lambda: make_ops_server(server[1])) as port:
        yield port


def call(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, object]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    try:
        return resp.status, json.loads(raw)
    except json.JSONDecodeError:
        return resp.status, raw.decode(errors="replace")


def test_filter_answers_in_the_schedulers_format(server):
    port, _ = server
    body = json.dumps({"Pod": pod_obj("nb", 5), "Nodes": None, "NodeNames": ["gpu-1", "gpu-2", "cpu-1"]})
    status, out = call(port, "POST", f"{PREFIX}/filter", body.encode())
    assert status == 200
    assert out["NodeNames"] == ["gpu-1", "gpu-2"] and out["Error"] == ""
    assert "cpu-1" in out["FailedAndUnresolvableNodes"]


def test_prioritize_answers_a_host_priority_list(server):
    port, _ = server
    body = json.dumps({"Pod": pod_obj("nb", 5), "NodeNames": ["gpu-1", "gpu-2"]})
    status, out = call(port, "POST", f"{PREFIX}/prioritize", body.encode())
    assert status == 200 and [h["Host"] for h in out] == ["gpu-1", "gpu-2"]
    assert all(0 <= h["Score"] <= 10 for h in out)


@pytest.mark.parametrize(
    "verb,body,message",
    [
        ("filter", b"{oops", "filter: body is not JSON"),
        ("filter", b'{"NodeNames": []}', "filter: field Pod is missing"),
        ("prioritize", b"null", "prioritize: body must be a JSON object"),
        ("bind", b'{"PodName": "p"}', "bind: field PodNamespace is missing"),
        ("bind", b'{"PodName": "", "PodNamespace": "ns", "Node": "n"}', "bind: field PodName is missing"),
    ],
)
def test_malformed_requests_get_400_with_a_message(server, verb, body, message):
    port, _ = server
    status, out = call(port, "POST", f"{PREFIX}/{verb}", body)
    assert status == 400 and message in out["Error"]


def test_a_negative_request_is_a_filter_error_with_the_reason(server):
    port, _ = server
    body = json.dumps({"Pod": pod_obj("neg", "-1"), "NodeNames": ["gpu-1"]})
    status, out = call(port, "POST", f"{PREFIX}/filter", body.encode())
    assert status == 200 and out["NodeNames"] == [] and "is negative" in out["Error"]


def test_unknown_paths_and_methods_answer_json(server):
    port, _ = server
    status, out = call(port, "GET", "/nope")
    assert status == 404 and "Error" in out
    status, out = call(port, "GET", f"{PREFIX}/filter")
    assert status == 405 and "Error" in out


def test_inspect_on_the_verbs_port_health_and_metrics_on_their_own(server, ops):
    port, _ = server
    assert call(ops, "GET", "/healthz") == (200, {"status": "ok"})
    status, ready = call(ops, "GET", "/readyz")
    assert status == 200 and ready["nodes"] == 2
    status, snap = call(port, "GET", "/inspect/gpu-1")
    assert status == 200 and [n["name"] for n in snap["nodes"]] == ["gpu-1"]
    assert call(port, "GET", "/inspect/nowhere")[0] == 404
    status, text = call(ops, "GET", "/metrics")
    assert status == 200 and "gpushare_extender_request_seconds" in text
    status, out = call(port, "GET", "/metrics")
    assert status == 404 and "on the metrics port" in out["Error"]
    status, out = call(ops, "POST", f"{PREFIX}/bind", b"{}")
    assert status == 404 and "the verbs and /inspect are on the other port" in out["Error"]


def test_bind_without_the_pods_uid_is_refused(server):
    port, _ = server
    body = json.dumps({"PodName": "p", "PodNamespace": "ns", "PodUID": "", "Node": "gpu-1"}).encode()
    status, out = call(port, "POST", f"{PREFIX}/bind", body)
    assert status == 200 and "PodUID is missing" in out["Error"]


def test_not_ready_answers_503_not_an_empty_ledger(server, ops):
    port, service = server
    service.informer.synced = False
    try:
        body = json.dumps({"Pod": pod_obj("nb", 1), "NodeNames": ["gpu-1"]}).encode()
        status, out = call(port, "POST", f"{PREFIX}/filter", body)
        assert status == 503 and "still reading the cluster" in out["Error"]
        assert call(ops, "GET", "/readyz")[0] == 503
    finally:
        service.informer.synced = True


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
quantity = st.one_of(st.integers(-5, 40), st.text(max_size=6), st.floats(allow_nan=False), st.none())
pods = st.builds(
    lambda q, name, ann: {
        "metadata": {"name": name, "namespace": "ns", "annotations": ann},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": q}}}]},
    },
    quantity,
    st.text(min_size=1, max_size=8),
    st.dictionaries(
        st.sampled_from(["gpushare-hub.io/policy", "gpushare-hub.io/card-models", "x"]),
        st.text(max_size=8),
        max_size=2,
    ),
)
bodies = st.one_of(
    st.binary(max_size=64),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda p, names, key: json.dumps({"Pod": p, key: names}).encode(),
        pods,
        st.lists(st.sampled_from(["gpu-1", "gpu-2", "x", ""]), max_size=3),
        st.sampled_from(["NodeNames", "nodenames", "Nodes"]),
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(verb=st.sampled_from(["filter", "prioritize"]), body=bodies)
def test_fuzz_never_a_500_and_always_a_message(server, verb, body):
    port, _ = server
    status, out = call(port, "POST", f"{PREFIX}/{verb}", body)
    assert status in (200, 400), (status, out)
    if status == 400:
        assert isinstance(out, dict) and out["Error"]


def test_tls_serves_https_with_the_given_certificate(tmp_path):
    pki = PKI(tmp_path)
    cred = pki.issue("extender", "gpushare-extender", server=True, hosts=("127.0.0.1",))
    service = ExtenderService(kube=None)
    service.informer.synced = True
    with serving(service, str(cred.cert), str(cred.key)) as port:
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)
        conn.request("GET", "/inspect")
        assert conn.getresponse().status == 200
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain.request("GET", "/inspect")
            plain.getresponse()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


def https(port: int, pki: PKI, client: Credential | None = None) -> http.client.HTTPSConnection:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if client is not None:
        ctx.load_cert_chain(str(client.cert), str(client.key))
    return http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=5)


def bind_body() -> bytes:
    """A bind that gets past the door and is then refused for its missing UID (no API server here)."""
    return json.dumps({"PodName": "p", "PodNamespace": "ns", "PodUID": "", "Node": "gpu-1"}).encode()


def test_mutual_tls_lets_only_holders_of_a_client_certificate_bind(pki, tmp_path):
    serving_cert = pki.issue("ext", "gpushare-extender", server=True, hosts=("127.0.0.1",))
    scheduler = pki.issue("sched", "kube-scheduler")
    stranger = PKI(tmp_path / "other").issue("evil", "kube-scheduler")
    service = ExtenderService(kube=None)
    service.ready = True
    with serving(service, str(serving_cert.cert), str(serving_cert.key), client_ca=str(pki.ca)) as port:
        conn = https(port, pki, scheduler)
        filter_body = json.dumps({"Pod": pod_obj("nb", 1), "NodeNames": ["gpu-1"]}).encode()
        conn.request("POST", f"{PREFIX}/filter", body=filter_body)
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        for who in (None, stranger):  # no certificate, or one our CA did not sign: no handshake
            with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException, OSError)):
                conn = https(port, pki, who)
                conn.request("POST", f"{PREFIX}/bind", body=bind_body())
                conn.getresponse().read()


def test_bearer_token_is_the_alternative_and_a_wrong_one_is_refused_with_the_way_out(pki):
    serving_cert = pki.issue("ext2", "gpushare-extender", server=True, hosts=("127.0.0.1",))
    scheduler = pki.issue("sched2", "kube-scheduler")
    service = ExtenderService(kube=None)
    service.ready = True
    token = "t0ken-" + "x" * 20
    with serving(service, str(serving_cert.cert), str(serving_cert.key), str(pki.ca), token) as port:
        for headers, status in (
            ({"Authorization": f"Bearer {token}"}, 200),
            ({"Authorization": "Bearer guessed"}, 401),
            ({}, 401),
        ):
            conn = https(port, pki)
            conn.request("POST", f"{PREFIX}/bind", body=bind_body(), headers=headers)
            resp = conn.getresponse()
            out = json.loads(resp.read())
            assert resp.status == status, out
            if status == 401:
                assert "unauthorized" in out["Error"] and "Authorization: Bearer" in out["Error"]
                assert "client certificate signed by" in out["Error"]
        conn = https(port, pki, scheduler)  # with a token configured, a client certificate still works
        conn.request("GET", "/inspect")
        assert conn.getresponse().status == 200


def _valid_pod() -> dict:
    return pod_obj("nb", 5)


@pytest.mark.parametrize(
    "change,message",
    [
        (
            lambda p: p["spec"].update(containers="notebook"),
            "Pod.spec.containers: expected a list, got a string",
        ),
        (
            lambda p: p["spec"]["containers"][0].update(resources=[1]),
            "Pod.spec.containers[0].resources: expected an object, got a list [1]",
        ),
        (
            lambda p: p["metadata"].update(annotations=7),
            "Pod.metadata.annotations: expected an object, got a number 7",
        ),
        (
            lambda p: p["metadata"].update(annotations={"gpushare-hub.io/policy": ["binpack"]}),
            "Pod.metadata.annotations['gpushare-hub.io/policy']: expected a string, got a list",
        ),
        (
            lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"aliyun.com/gpu-mem": [5]}),
            "Pod.spec.containers[0].resources.limits['aliyun.com/gpu-mem']: expected a quantity",
        ),
        (lambda p: p["metadata"].update(uid={"a": 1}), "Pod.metadata.uid: expected a string, got an object"),
        (lambda p: p["metadata"].update(name="x" * 300), "Pod.metadata.name: 300 characters, more than 253"),
    ],
)
def test_a_pod_of_the_wrong_shape_gets_400_naming_the_field(server, change, message):
    port, service = server
    before = service.ledger.snapshot()
    pod = _valid_pod()
    change(pod)
    for verb in ("filter", "prioritize"):
        body = json.dumps({"Pod": pod, "NodeNames": ["gpu-1"]}).encode()
        status, out = call(port, "POST", f"{PREFIX}/{verb}", body)
        assert status == 400, (status, out)
        assert out["Error"].startswith(f"{verb}: {message}"), out
    assert service.ledger.snapshot() == before


def test_deep_nesting_long_lists_and_odd_bind_fields_get_400(server):
    port, _ = server
    deep = b'{"Pod": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, out = call(port, "POST", f"{PREFIX}/filter", deep)
    assert status == 400 and "nests too deeply" in out["Error"], out
    value: object = 1
    for _ in range(40):
        value = [value]
    nested = {"Pod": _valid_pod(), "NodeNames": ["gpu-1"], "x": value}
    status, out = call(port, "POST", f"{PREFIX}/filter", json.dumps(nested).encode())
    assert status == 400 and "nests deeper than 32 levels" in out["Error"], out
    many = json.dumps({"Pod": _valid_pod(), "NodeNames": ["n"] * 10_001}).encode()
    status, out = call(port, "POST", f"{PREFIX}/filter", many)
    assert status == 400 and "NodeNames has 10001 names, more than 10000" in out["Error"]
    bind = {"PodName": ["p"], "PodNamespace": "ns", "PodUID": "u", "Node": "gpu-1"}
    status, out = call(port, "POST", f"{PREFIX}/bind", json.dumps(bind).encode())
    assert status == 400 and "field PodName is missing or not a non-empty string: ['p']" in out["Error"]


@pytest.mark.parametrize("path", ["/inspect", "/inspect/gpu-1", "/nowhere", f"{PREFIX}/bind"])
def test_every_path_of_the_verbs_port_refuses_a_large_body_before_it_is_sent(server, path):
    """/inspect and the 404 stream their body too: the port's server would read a body of up to
    1 TiB whole for a handler that does not (its max_body_size is set that high for the verbs)."""
    port, _ = server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n".encode())
        conn.sendall(b"a" * 10000)
        answer = conn.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413") and b"more than 4194304" in answer, (path, answer[:300])


def test_a_body_past_the_limit_is_refused_with_413_before_it_is_parsed():
    from gpushare_hub.extender.handlers import make_app

    service = ExtenderService(kube=None)
    service.informer.synced = True
    make = lambda: HTTPServer(make_app(service, PREFIX, max_body_bytes=1000), max_body_size=1 << 40)  # noqa: E731
    with serving_any(make) as port:
        status, out = call(port, "POST", f"{PREFIX}/filter", b" " * 5000)
        assert status == 413 and out["Error"] == (
            "filter: the body has 5000 bytes, more than 1000; no valid request is this big"
        )
        body = json.dumps({"Pod": _valid_pod(), "NodeNames": ["gpu-1"]}).encode()
        assert len(body) < 1000
        assert call(port, "POST", f"{PREFIX}/filter", body)[0] == 200
