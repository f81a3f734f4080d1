"""The hub service's doors behind the session's real JupyterHub and proxy: every route with random
query strings and path suffixes, as a user, an admin and the metrics scraper; never a 5xx, every
refusal in JSON (or a short page for the dashboard) naming what was wrong, nothing in the hub's
log (where the service writes) that is a traceback."""

from __future__ import annotations

import json
import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.hub.conftest import BUDGET_USERS, SCRAPER_TOKEN, SERVICE, SERVICE_ADMIN

from .conftest import HubClient, LogWatch, Tally, report, seeded

pytestmark = pytest.mark.fuzz
ROUTES = [
    "api/v1/ledger",
    "api/v1/availability",
    "api/v1/me",
    "api/v1/budgets",
    "api/v1/history",
    "api/v1/planning",
    "metrics",
    "",
    "api/v1/nothing",
]
KEYS = (
    st.sampled_from(
        ["node", "model", "user", "refresh", "x", "node[]", "", "format", "names", "since", "until"]
    )
    | st.sampled_from(["cards", "catalogue", "policy"])
    | st.text(max_size=20)
)
VALUES = (
    st.sampled_from(
        ["nb-1", "Tesla-T4", "alice", "5", "0", "99999", "-1", "\x00", "a" * 300, "csv", "json", "real"]
    )
    | st.sampled_from(["pseudonyms", "9999-12-31T23:59:59-23:59", "0001-01-01", "2026-11-01", "2026-13-01"])
    | st.sampled_from(["1..4", "4..1", "1..99999", "0", "3,5,7;4,8", ";", "3,,5", "16", "fgd", "binpack,x"])
    | st.text(max_size=40)
)
queries = st.lists(st.tuples(KEYS, VALUES), max_size=3).map(
    lambda pairs: urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote)
)


@pytest.mark.parametrize("who", ["user", "admin", "scraper"])
def test_the_hub_service_answers_every_query_without_a_5xx(hub, who):
    token = {
        "user": hub.user_token("fuzzy"),
        "admin": hub.user_token(SERVICE_ADMIN),
        "scraper": SCRAPER_TOKEN,
    }[who]
    client = HubClient(hub.url, token)
    watch = LogWatch(hub.hub_log)
    tally = Tally(f"hub service as {who}")

    @seeded
    @given(
        route=st.sampled_from(ROUTES),
        query=queries,
        suffix=st.sampled_from(["", "", "", "", "", "", "/", "/x", "//..", "%00"]),
    )
    def case(route: str, query: str, suffix: str) -> None:
        path = f"/services/{SERVICE}/{route}{suffix if route else ''}" + (f"?{query}" if query else "")
        resp = client.send("GET", path)
        raw = resp.read()
        tally.add(resp.status)
        assert resp.status < 500, (resp.status, path, raw[:300])
        if resp.status >= 400 and "json" in resp.getheader("Content-Type", ""):
            assert json.loads(raw)["message"], raw

    case()
    text = watch.added()
    tracebacks = text.count("Traceback")
    report(tally.line(tracebacks))
    assert tracebacks == 0, text[text.find("Traceback") :][:3000]


BODIES = (
    st.sampled_from([b"", b"{}", b'{"server": ""}', b'{"server": "x"}', b"null", b"[]", b'{"server": 5}'])
    # Nesting deeper than the JSON parser's stack, within the size limit.
    | st.sampled_from([b"[" * 4000, b'{"server": ' + b"[" * 4000])
    | st.binary(max_size=64)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=8,
    ).map(lambda v: json.dumps({"server": v} if isinstance(v, str) else v).encode())
    | st.integers(4000, 9000).map(lambda n: json.dumps({"server": "a" * n}).encode())
)


def test_keep_answers_every_body_without_a_5xx_and_keeps_nothing_it_refused(hub):
    """``POST api/v1/me/keep``, the service's one door that writes: any body, as a user with no
    idle slice. Every answer is a 4xx naming the problem (400 for a body that is not the form,
    404 for a well-formed one: nothing of this user's is idle), and no Keep is stored."""
    token = hub.user_token("fuzzy-keeper")
    client = HubClient(hub.url, token)
    watch = LogWatch(hub.hub_log)
    tally = Tally("hub service keep")
    path = f"/services/{SERVICE}/api/v1/me/keep"

    @seeded
    @given(body=BODIES)
    def case(body: bytes) -> None:
        resp = client.send("POST", path, body)
        raw = resp.read()
        tally.add(resp.status)
        assert 400 <= resp.status < 500, (resp.status, body[:100], raw[:300])
        assert json.loads(raw)["message"], raw

    case()
    text = watch.added()
    tracebacks = text.count("Traceback")
    report(tally.line(tracebacks))
    assert tracebacks == 0, text[text.find("Traceback") :][:3000]
    assert "pressed Keep" not in text


BUDGET_BODIES = (
    st.sampled_from([b"", b"{}", b"null", b"[]", b'{"add_gib_hours": "5"}', b'{"add_gib_hours": -1}'])
    | st.sampled_from([b'{"add_gib_hours": 1e999}', b'{"add_gib_hours": NaN}', b'{"add_gib_hours": true}'])
    | st.sampled_from([b"[" * 4000, b'{"add_gib_hours": ' + b"[" * 4000])
    | st.binary(max_size=64)
    | st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=8,
    ).map(lambda v: json.dumps({"add_gib_hours": v}).encode())
    | st.floats(allow_nan=False, allow_infinity=False).map(
        lambda v: json.dumps({"add_gib_hours": v}).encode()
    )
)
# Names the hub has no budget for: fuzzy-budget exists in no budget group, the rest do not exist.
BUDGET_NAMES = st.sampled_from(
    ["fuzzy-budget", "fuzzy-budget", "nobody", "a" * 300, "%00", "a%62", "..", "x/y"]
) | st.text(max_size=30)


@pytest.mark.parametrize("who", ["user", "admin"])
def test_budget_additions_answer_every_body_and_name_without_a_5xx_and_add_nothing_they_refused(hub, who):
    """``POST api/v1/budgets/<user>``, the admins' door that writes: any body, any name. A user
    gets 403; the admin gets 400 for a body that is not ``{"add_gib_hours": <number>}``, 404 for a
    name the hub does not know, 409 for a user without a budget; nothing is added to anyone."""
    token = hub.user_token("fuzzy-budget" if who == "user" else SERVICE_ADMIN)
    admin = hub.user_token(SERVICE_ADMIN)
    client = HubClient(hub.url, token)
    watch = LogWatch(hub.hub_log)
    tally = Tally(f"hub service budget additions as {who}")
    before = added(hub, admin)

    @seeded
    @given(name=BUDGET_NAMES, body=BUDGET_BODIES)
    def case(name: str, body: bytes) -> None:
        if name in BUDGET_USERS:
            return
        path = f"/services/{SERVICE}/api/v1/budgets/" + urllib.parse.quote(name, safe="")
        resp = client.send("POST", path, body)
        raw = resp.read()
        tally.add(resp.status)
        assert 400 <= resp.status < 500, (resp.status, name, body[:100], raw[:300])
        assert json.loads(raw)["message"], raw
        if who == "user":
            assert resp.status in (403, 404), (resp.status, raw)

    case()
    text = watch.added()
    tracebacks = text.count("Traceback")
    report(tally.line(tracebacks))
    assert tracebacks == 0, text[text.find("Traceback") :][:3000]
    assert "'s GPU budget for the" not in text  # the service logs every addition
    assert added(hub, admin) == before, "a refused addition changed someone's budget"


def added(hub, admin: str) -> dict[str, float]:
    """What admins added to each user's window so far (other tests of the session add some)."""
    status, doc = hub.request("GET", f"{hub.url}/services/{SERVICE}/api/v1/budgets", admin)
    assert status == 200, (status, doc)
    return {row["user"]: row["added_gib_hours"] for row in doc["users"]}
