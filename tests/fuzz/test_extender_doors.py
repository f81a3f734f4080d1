"""The extender's doors (filter, prioritize, bind, /inspect) against the real extender process of
the session cluster: mutated valid bodies, junk bytes and deep nesting; never a 5xx."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import gpu_pod
from tests.mutate import paths, replaced

from .conftest import LogWatch, Tally, report, seeded

pytestmark = pytest.mark.fuzz
PREFIX = "/gpushare-scheduler"

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["5", "-1", "1e400", "0.5", "5Gi", "", "aliyun.com/gpu-mem", "x" * 300]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=10,
)


def valid_bodies(node: str) -> dict[str, dict[str, Any]]:
    pod = gpu_pod("fuzz", 5, "gpushare-scheduler", {"fuzz": "none"})
    pod["metadata"].update(namespace="fuzz-nowhere", uid="00000000-0000-0000-0000-00000000f022")
    pod["metadata"]["annotations"] = {"gpushare-hub.io/policy": "binpack", "gpushare-hub.io/isolation": "mps"}
    pod["spec"]["initContainers"] = [{"name": "init", "resources": {"requests": {"cpu": "1"}}}]
    args = {"Pod": pod, "NodeNames": [node, "no-such-node"]}
    bind = {"PodName": "fuzz", "PodNamespace": "fuzz-nowhere", "PodUID": pod["metadata"]["uid"], "Node": node}
    return {"filter": args, "prioritize": args, "bind": bind}


def mutations(valid: dict[str, Any]) -> st.SearchStrategy[bytes]:
    every = list(paths(valid))
    mutated = st.builds(
        lambda path, new: json.dumps(replaced(valid, path, new)).encode(),
        st.sampled_from(every),
        json_values,
    )
    removed = st.builds(
        lambda path: json.dumps(replaced(valid, path, ...)).encode(), st.sampled_from(every[1:])
    )
    deep = st.integers(33, 200_000).map(lambda n: b'{"Pod": ' + b"[" * n + b"]" * n + b"}")
    return st.one_of(mutated, mutated, mutated, removed, st.binary(max_size=200), deep)


class Extender:
    def __init__(self, url: str) -> None:
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=10)

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        for attempt in (1, 2):
            try:
                self.conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
                resp = self.conn.getresponse()
                return resp.status, resp.read()
            except (http.client.HTTPException, ConnectionError):
                self.conn.close()
                self.conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def snapshot(ext: Extender) -> dict[str, Any]:
    status, raw = ext.call("GET", "/inspect")
    assert status == 200, raw
    return json.loads(raw)  # type: ignore[no-any-return]


def mine(snap: dict[str, Any], node: str) -> list[dict[str, Any]]:
    """This test's node in the ledger (other tiers' nodes may still be changing)."""
    return [n for n in snap["nodes"] if n["name"] == node]


@pytest.mark.parametrize("door", ["filter", "prioritize", "bind"])
def test_an_extender_door_answers_every_mutated_body_without_a_5xx(local_cluster, gpushare, node_group, door):
    (node,), _ = node_group(1, cards=2)
    ext = Extender(gpushare.url)
    watch = LogWatch(gpushare.extender.log)
    valid = valid_bodies(node)[door]
    status, raw = ext.call("POST", f"{PREFIX}/{door}", json.dumps(valid).encode())
    assert status == 200, raw  # the unmutated body is a request the extender takes
    before = mine(snapshot(ext), node)
    tally = Tally(door)

    @seeded
    @given(body=mutations(valid))
    def case(body: bytes) -> None:
        status, raw = ext.call("POST", f"{PREFIX}/{door}", body)
        tally.add(status)
        assert status < 500, (status, raw[:300], body[:300])
        if status >= 400:
            assert json.loads(raw)["Error"], raw

    case()
    tracebacks, first = watch.first_traceback()
    report(tally.line(tracebacks))
    assert tracebacks == 0, first
    assert gpushare.extender.proc.poll() is None, "the extender died"
    assert mine(snapshot(ext), node) == before, "a refused request changed the ledger"


def test_the_inspect_door_answers_every_node_name_without_a_5xx(local_cluster, gpushare):
    ext = Extender(gpushare.url)
    watch = LogWatch(gpushare.extender.log)
    tally = Tally("inspect")

    @seeded
    @given(name=st.text(min_size=1, max_size=300))
    def case(name: str) -> None:
        status, raw = ext.call("GET", "/inspect/" + urllib.parse.quote(name, safe=""))
        tally.add(status)
        assert status in (200, 404), (status, raw[:300], name[:80])
        assert json.loads(raw), raw

    case()
    tracebacks, first = watch.first_traceback()
    report(tally.line(tracebacks))
    assert tracebacks == 0, first
