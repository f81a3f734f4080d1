"""GPUShareSpawner's door: ``user_options`` sent by a user to JupyterHub's REST API (``POST
/hub/api/users/<name>/server``), against the session's real hub, proxy and cluster. Bodies are
valid requests mutated one field at a time, fields added (resources, images, overrides), other JSON
documents and bytes that are not JSON. Each is refused with a 4xx whose message says what was wrong,
never a 5xx or a traceback in the hub's log; no pod is created and no server is left pending."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from hypothesis import strategies as st

from tests.mutate import paths, replaced
from tests.support.fuzzing import drawn, send_all
from tests.support.hub_helpers import NAMESPACE, SLICES, hub_spawner_config

from .conftest import CASES, HubClient, LogWatch, Tally, report, seeded

pytestmark = pytest.mark.fuzz
# Each sends its share of the cases to its own server's door, one at a time (a user's second
# POST while the first is answered would be refused for that, not for its body).
USERS = [f"fuzz-options-{i}" for i in range(4)]
# JupyterHub's API handler logs each body that is not JSON with a traceback, before our code runs.
JUPYTERHUB_BAD_JSON = "Couldn't parse JSON"
SLUGS = [s["slug"] for s in SLICES] + [p["slug"] for p in hub_spawner_config()["profile_list"]]
# What a hostile user adds to ask for more than the form offers.
ADDED_KEYS = st.sampled_from(
    ["kubespawner_override", "image", "extra_resource_limits", "cpu_limit", "node_selector", "gpushare_slice"]
) | st.text(max_size=30)
junk = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=60)
    | st.sampled_from(["t4-5g ", "T4-5G", "../t4-5g", "a" * 100_000, "t4-5g\x00", "{{7*7}}", "<b>x</b>"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


def _valid(body: bytes) -> bool:
    """A request the hub should accept (these start servers; the hub tier proves them). JupyterHub
    reads an empty or falsy body (``[]``, ``0``, ``""``) as no options, a body with ``display_name``
    or ``user_options`` in its newer form, and any other object as the options themselves."""
    try:
        doc = json.loads(body) if body.strip() else None
    except (ValueError, RecursionError):
        return False
    if not doc:
        return True
    if not isinstance(doc, dict):
        return False
    if "display_name" in doc or "user_options" in doc:
        if not isinstance(doc.get("display_name"), str | None):
            return False
        options = doc.get("user_options")
    else:
        options = doc
    if options is None:
        return True
    if not isinstance(options, dict) or not set(options) <= {"profile"}:
        return False
    return options.get("profile") in (None, "", *SLUGS)


@st.composite
def bodies(draw: Any) -> bytes:
    base: dict[str, Any] = {"profile": draw(st.sampled_from(SLUGS))}
    how = draw(st.sampled_from(["replace", "replace", "add", "whole", "bytes", "deep"]))
    if how == "replace":
        path = draw(st.sampled_from(list(paths(base))))
        value = replaced(base, path, draw(junk))
    elif how == "add":
        value = {**base, draw(ADDED_KEYS): draw(junk)}
    elif how == "whole":
        value = draw(junk)
    elif how == "deep":  # nested past any parser's recursion limit
        n = draw(st.integers(1, 100_000))
        return b'{"profile": ' + b"[" * n + b"]" * n + b"}"
    else:
        return draw(st.binary(max_size=200))
    return json.dumps(value).encode()


def test_the_spawn_api_refuses_malformed_user_options_with_a_4xx(hub, local_cluster):
    """The seeded cases are drawn first, then sent by USERS users side by side (each its own
    connection and server), so JupyterHub answers one while the next is on its way."""
    cases = drawn(bodies(), lambda body: not _valid(body), seeded)
    assert len(cases) == CASES, len(cases)
    # Straight to JupyterHub's port: the proxy would only add its own CPU to every case.
    clients = [HubClient(hub.direct_url, hub.user_token(user), timeout=60) for user in USERS]
    watch = LogWatch(hub.hub_log)
    tally = Tally("spawner user_options")
    counted = threading.Lock()

    def case(worker: int, body: bytes) -> None:
        resp = clients[worker].send("POST", f"/hub/api/users/{USERS[worker]}/server", body)
        status, raw = resp.status, resp.read()
        with counted:
            tally.add(status)
        assert 400 <= status < 500, (status, body[:200], raw[:300])
        message = json.loads(raw)["message"]
        assert message and len(message) < 600, message

    try:
        failures = send_all(cases, len(USERS), case)
    finally:
        for client in clients:
            client.conn.close()
        models = {user: hub.api("GET", f"/users/{user}")[1] for user in USERS}
        for user, model in models.items():
            if model.get("servers"):  # an accepted body: stop what it started before failing
                hub.api("DELETE", f"/users/{user}/server")
    tracebacks, upstream, first = watch.tracebacks(upstream=(JUPYTERHUB_BAD_JSON,))
    report(
        f"{tally.line(tracebacks)}; JupyterHub's own parser logged {upstream} bodies that are not JSON "
        f"({len(USERS)} users side by side)"
    )
    assert not failures, str(failures)
    assert tracebacks == 0, first
    for model in models.values():
        assert not model.get("servers") and not model.get("pending"), model
    pods = local_cluster.get_json(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
    made = [p["metadata"]["name"] for p in pods if any(user in p["metadata"]["name"] for user in USERS)]
    assert not made, f"a refused spawn made a pod: {made}"
