"""The hub service's doors behind the session's real JupyterHub and proxy: every route with random
query strings and path suffixes, as every kind of caller (a user's token, a server's, an admin
user's server's, a gpushare admin's, a hub admin's, services', an admin's browser cookie); bodies
past the limit without a token; Keep and budget additions with any body. Never a 5xx; every
caller gets its route's status class (403 where its token does not open the route); every refusal
in JSON (or a short page for the dashboard) naming what was wrong; nothing in the hub's log (where
the service writes) that is a traceback. The cases of each door are drawn seeded first, then sent
:data:`WORKERS` at a time (:func:`door`)."""

from __future__ import annotations

import functools
import http.client
import http.cookiejar
import json
import os
import re
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest
from hypothesis import strategies as st

from tests.support.fuzzing import drawn, send_all
from tests.support.hub_helpers import BUDGET_USERS, SCRAPER_TOKEN, SERVICE, SERVICE_ADMIN

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
ADMIN_ROUTES = {"api/v1/ledger", "api/v1/budgets", "api/v1/history", "api/v1/planning", "metrics", ""}
# Who calls, and the routes their token opens (every other route answers 403; api/v1/nothing and
# any suffix 404): docs/security.md's table.
OPENS = {
    "user": {"api/v1/availability", "api/v1/me"},
    "admin": {*ADMIN_ROUTES, "api/v1/availability", "api/v1/me"},  # custom:gpushare:admin
    "hub admin": {*ADMIN_ROUTES, "api/v1/availability", "api/v1/me"},  # admin:users, admin-ui
    "server": {"api/v1/me"},  # a notebook server's token
    "admin's server": {"api/v1/me"},  # a hub admin's notebook server's token
    "scraper": {"api/v1/availability", "metrics"},  # a service with the metrics scope
    "admin service": {*ADMIN_ROUTES, "api/v1/availability"},  # a service with JupyterHub's admin role
}
# Numbers in any Unicode digit class (str.isdigit() is true of most, int() of some) and ranges
# far past the planning bounds, whose lists used to be built before they were checked.
UNICODE_NUMBERS = st.sampled_from(
    ["²", "٣", "１２", "߁", "৪", "𝟗", "三", "½", "Ⅻ", "⁴", "٠٠٧", "1²", "٣..٤", "1..²", "١,٢"]
) | st.text(st.characters(categories=["Nd", "No", "Nl"]), min_size=1, max_size=6)
HUGE = st.sampled_from(
    ["1.." + "9" * 190, "1..99999999999", "1..200000000", "99999999999", "9" * 400, "0..4096", "4096..1"]
) | st.integers(0, 10**30).map(lambda n: f"1..{n}")
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
    | st.sampled_from(["0001-01-01T00:00:00+05:00", "2026-11-01T00:00:00+99:00", "٢٠٢٦-11-01"])
    | st.sampled_from(["1..4", "4..1", "1..99999", "0", "3,5,7;4,8", ";", "3,,5", "16", "fgd", "binpack,x"])
    | UNICODE_NUMBERS
    | HUGE
    | st.text(max_size=40)
)
queries = st.lists(st.tuples(KEYS, VALUES), max_size=3).map(
    lambda pairs: urllib.parse.urlencode(pairs, quote_via=urllib.parse.quote)
)
SUFFIXES = st.sampled_from(["", "", "", "", "", "", "/", "/x", "//..", "%00"])
ROUTE_CASES = st.tuples(st.sampled_from(ROUTES), queries, SUFFIXES)
# Cases in flight at once, each worker with its own connection (FUZZ_WORKERS overrides it).
WORKERS = int(os.environ.get("FUZZ_WORKERS", 12))
T = TypeVar("T")


@functools.cache
def cases_of(strategy: st.SearchStrategy[T]) -> list[T]:
    """The door's seeded cases of ``strategy``, drawn once per session: the doors of every kind
    of caller at the routes, and both callers of the budget door, send the same cases, as each
    door's own draw would give them (drawing was most of a door's time)."""
    return drawn(strategy, lambda _: True, seeded)


def door(
    tally: Tally, watch: LogWatch, cases: Sequence[T], attempt: Callable[[int, T], tuple[int, str]]
) -> str:
    """Send ``cases`` from :data:`WORKERS` workers side by side; ``attempt(worker, case)`` sends one
    (on the worker's own connection) and says what was wrong with the answer (``""``: nothing),
    with its status. Prints the door's counts; every case checked, none wrong, no traceback in the
    hub's log (where the service writes); the log's text since the door began."""

    def check(worker: int, case: T) -> None:
        status, wrong = attempt(worker, case)
        tally.add(status)
        assert not wrong, wrong

    failures = send_all(cases, WORKERS, check)
    text = watch.added()
    tracebacks = text.count("Traceback")
    report(tally.line(tracebacks))
    assert not failures, f"{tally.door}: {failures}"
    assert tracebacks == 0, text[text.find("Traceback") :][:3000]
    return text


def clients(url: str, token: str) -> list[HubClient]:
    """A keep-alive connection per worker, to ``url``."""
    return [HubClient(url, token) for _ in range(WORKERS)]


@pytest.fixture(scope="module")
def service_url(hub: Any) -> str:
    """The service's own address, as the hub's API gives it: the doors that send thousands of
    cases with a token go straight there, under the same paths (the proxy forwards them
    unchanged and only added its own CPU to every case). The cookie's door and the body-limit
    door still go through the proxy, as a browser and an anonymous client would."""
    status, model = hub.api("GET", f"/services/{SERVICE}")
    assert status == 200 and model.get("url"), (status, model)
    return str(model["url"])


def service_path(route: str, query: str, suffix: str) -> str:
    return f"/services/{SERVICE}/{route}{suffix if route else ''}" + (f"?{query}" if query else "")


def no_route(route: str, suffix: str) -> int | None:
    """What a path that no GET route serves answers, whoever asks (None: a route serves it):
    404, or 405 for ``api/v1/budgets/<user>``, which takes a POST only."""
    if route == "api/v1/budgets" and suffix == "/x":
        return 405
    if (suffix and route) or route == "api/v1/nothing":
        return 404
    return None


def expected(route: str, suffix: str, opens: set[str]) -> int | None:
    """:func:`no_route`'s answer, 403 for a route the caller may not use, None where the route
    is open to the caller (any answer below 500 but 401 and 403)."""
    unserved = no_route(route, suffix)
    if unserved is not None:
        return unserved
    return None if route in opens else 403


def get(client: HubClient, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, str]:
    """GET ``path``: the status, the body and its Content-Type. A 429 (another plan is being
    computed: the doors send concurrently) is sent again until the plan is done, so that every
    planning case reaches the planner as when the cases went one at a time."""
    for _ in range(600):
        resp = client.send("GET", path, headers=headers)
        raw = resp.read()
        if resp.status != 429:
            break
        time.sleep(0.05)
    return resp.status, raw, resp.getheader("Content-Type", "")


def problem(status: int, raw: bytes, ctype: str, want: int | None) -> str:
    """What is wrong with an answer (``""``: nothing); ``want`` as :func:`expected` says."""
    if status >= 500:
        return f"{status}: {raw[:300]!r}"
    if want is None and status in (401, 403):
        return f"{status} on a route the caller may use: {raw[:300]!r}"
    if want is not None and status != want:
        return f"{status}, not {want}: {raw[:300]!r}"
    if status >= 400 and "json" in ctype:
        try:
            if not json.loads(raw)["message"]:
                return f"{status} with an empty message"
        except (ValueError, KeyError, TypeError):
            return f"{status} whose JSON has no message: {raw[:300]!r}"
    return ""


def token_with_scopes(hub: Any, user: str, scopes: list[str]) -> str:
    status, body = hub.api(
        "POST", f"/users/{user}/tokens", {"note": "fuzz", "expires_in": 7200, "scopes": scopes}
    )
    assert status == 201, (status, body)
    return str(body["token"])


def hub_admin(hub: Any, user: str) -> str:
    """A token of ``user``, made a hub admin first (its token then holds the admin role's scopes)."""
    hub.api("POST", f"/users/{user}")
    status, body = hub.api("PATCH", f"/users/{user}", {"admin": True})
    assert status == 200 and body["admin"] is True, (status, body)
    return str(hub.user_token(user))


def server_token(hub: Any, user: str) -> str:
    """A token with the scopes JupyterHub's ``server`` role gives a notebook server of ``user``
    (with the service's access, as ``configure_hub`` extends the role)."""
    hub.api("POST", f"/users/{user}")
    scopes = [
        f"access:servers!server={user}/",
        f"users:activity!user={user}",
        f"access:services!service={SERVICE}",
    ]
    return token_with_scopes(hub, user, scopes)


@pytest.fixture(scope="module")
def tokens(hub: Any) -> dict[str, str]:
    """A token of each kind of caller in :data:`OPENS`."""
    return {
        "user": hub.user_token("fuzzy"),
        "admin": hub.user_token(SERVICE_ADMIN),
        "hub admin": hub_admin(hub, "fuzzy-boss"),
        "server": server_token(hub, "fuzzy"),
        "admin's server": server_token(hub, "fuzzy-boss"),
        "scraper": SCRAPER_TOKEN,
        "admin service": hub.token,  # the harness: a service with JupyterHub's admin role
    }


@pytest.mark.parametrize("who", list(OPENS))
def test_every_kind_of_token_gets_its_answer_at_every_route_without_a_5xx(hub, service_url, tokens, who):
    watch, tally = LogWatch(hub.hub_log), Tally(f"hub service as {who}")
    sessions = clients(service_url, tokens[who])

    def attempt(worker: int, case: tuple[str, str, str]) -> tuple[int, str]:
        route, query, suffix = case
        status, raw, ctype = get(sessions[worker], service_path(route, query, suffix))
        return status, problem(status, raw, ctype, expected(route, suffix, OPENS[who]))

    door(tally, watch, cases_of(ROUTE_CASES), attempt)


# What a browser says of a request: a link followed, an <img> in a notebook (the hub's origin), an
# <img> on another site's page, a page's fetch(); nothing (curl, or a browser on plain http).
FETCHES = [
    {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Site": "same-origin"},
    {"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Site": "same-origin"},
    {"Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Mode": "cors", "Sec-Fetch-Site": "same-origin"},
    {},
]


def browser_login(hub: Any, user: str) -> tuple[str, str]:
    """The ``Cookie`` header of a browser in which ``user`` logged in to the hub and opened the
    service's dashboard (JupyterHub's login form, then the service's OAuth), and the XSRF token
    the dashboard's page gives its own calls."""
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = browser.open(f"{hub.url}/hub/login", timeout=30).read().decode()
    found = re.search(r'name="_xsrf" value="([^"]+)"', form)
    assert found, form[:500]
    fields = {"username": user, "password": "fuzz", "_xsrf": found.group(1)}
    browser.open(f"{hub.url}/hub/login", urllib.parse.urlencode(fields).encode(), timeout=30).read()
    page = browser.open(f"{hub.url}/services/{SERVICE}/", timeout=30).read().decode()
    found = re.search(r'"xsrf": ("[^"]*")', page)
    assert found, f"no dashboard after the login: {page[:500]}"
    request = urllib.request.Request(f"{hub.url}/services/{SERVICE}/api/v1/ledger")
    jar.add_cookie_header(request)
    return str(request.get_header("Cookie")), str(json.loads(found.group(1)))


def cookie_expected(route: str, suffix: str, fetch: dict[str, str], right_xsrf: bool) -> set[int] | None:
    """The statuses a cookie-only request may get (None: the route is open, as to the admin).

    JupyterHub takes the cookie without an XSRF token on a navigation, a same-origin image and a
    request that names no mode; the dashboard's page is then shown (else the login is asked
    again: 302). The API takes the cookie only with the page's XSRF token: 403 naming it where
    JupyterHub took the cookie, 401 where it did not."""
    unserved = no_route(route, suffix)
    if unserved is not None:
        return {unserved}
    mode, site = fetch.get("Sec-Fetch-Mode", ""), fetch.get("Sec-Fetch-Site", "")
    hub_takes = right_xsrf or mode in ("", "navigate") or (mode == "no-cors" and site == "same-origin")
    if route == "":
        return {200, 400} if hub_takes else {302}
    if right_xsrf:
        return None
    return {403} if hub_takes else {401}


def test_an_admins_cookie_opens_the_dashboard_and_never_the_api_without_the_pages_xsrf_token(hub):
    """Cookie-only GETs with an admin's browser cookie, no token: a link or an image in a notebook
    the admin opens starts no plan, reads no ledger, exports no history. The routes' cases, each
    with one of :data:`FETCHES` and an ``X-XSRFToken`` header (none, the page's, one a character
    off, hostile ones) in turn, so that every pair comes as often."""
    watch, tally = LogWatch(hub.hub_log), Tally("hub service with an admin's cookie and no token")
    cookie, xsrf = browser_login(hub, SERVICE_ADMIN)
    tokens = ["", xsrf, xsrf[:-1] + ("A" if xsrf[-1] != "A" else "B"), xsrf + "a", "é" * 8, "a" * 300]
    pairs = [(fetch, token) for token in tokens for fetch in FETCHES]
    cases = [(case, *pairs[i % len(pairs)]) for i, case in enumerate(cases_of(ROUTE_CASES))]
    sessions = clients(hub.url, "")

    def attempt(worker: int, case: tuple[tuple[str, str, str], dict[str, str], str]) -> tuple[int, str]:
        (route, query, suffix), fetch, token = case
        headers = {"Cookie": cookie, **fetch, **({"X-XSRFToken": token} if token else {})}
        status, raw, ctype = get(sessions[worker], service_path(route, query, suffix), headers)
        want = cookie_expected(route, suffix, fetch, token == xsrf)
        if want is None:
            return status, problem(status, raw, ctype, None)
        if status not in want:
            return status, f"{status}, not one of {sorted(want)}: {raw[:300]!r}"
        if status == 403 and b"XSRF" not in raw:
            return status, f"403 that does not name the XSRF token: {raw[:300]!r}"
        return status, problem(status, raw, ctype, status)

    door(tally, watch, cases, attempt)


MAX_BODY = 4096  # the service's limit (gpushare_hub.service.handlers.base.MAX_BODY_BYTES)
SENT_AT_MOST = 16 * 1024  # of a larger body: the answer must come before the rest is sent
BIG_PATHS = [
    *(f"/services/{SERVICE}/{route}" for route in ROUTES),
    f"/services/{SERVICE}/api/v1/me/keep",
    f"/services/{SERVICE}/api/v1/budgets/budget-bob",
    f"/services/{SERVICE}/oauth_callback",
    f"/services/{SERVICE}",  # the prefix's redirect
    f"/services/{SERVICE}/metrics/x",  # no route
    f"/services/{SERVICE}/static/../api/v1/me/keep",
]
BIG_BODIES = st.tuples(
    st.sampled_from(["POST", "POST", "PUT", "PATCH", "DELETE", "GET"]),
    st.sampled_from(BIG_PATHS),
    st.integers(MAX_BODY + 1, 3 * MAX_BODY) | st.integers(3 * MAX_BODY, 2**40),
    st.sampled_from(["length", "length", "chunked", "expect-continue"]),
    st.sampled_from(["", "", "", "token nonsense", "Bearer " + "a" * 64, "token " + "\t" * 3]),
).filter(
    # configurable-http-proxy sends a DELETE without a Content-Length on with none (and no body):
    # the proxy's door, not the service's.
    lambda case: not (case[0] == "DELETE" and case[3] == "chunked")
)


def send_big_body(host: str, port: int, case: tuple[str, str, int, str, str]) -> tuple[int, bytes, int]:
    """Send a body of ``size`` bytes (at most :data:`SENT_AT_MOST` of it) with no valid token:
    the status, the answer, and how many bytes of the body were sent before it came."""
    method, path, size, framing, auth = case
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
    head += f"Authorization: {auth}\r\n" if auth else ""
    head += "Transfer-Encoding: chunked\r\n" if framing == "chunked" else f"Content-Length: {size}\r\n"
    head += "Expect: 100-continue\r\n" if framing == "expect-continue" else ""
    sent = 0
    with socket.create_connection((host, port), timeout=20) as sock:
        sock.sendall(head.encode() + b"\r\n")
        try:
            while sent < min(size, SENT_AT_MOST):
                piece = b"a" * min(2048, size - sent)
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if framing == "chunked" else piece)
                sent += len(piece)
            if framing == "chunked" and sent == size:
                sock.sendall(b"0\r\n\r\n")
        except OSError:  # the answer came and the connection was closed: read the answer
            pass
        resp = http.client.HTTPResponse(sock, method=method)
        resp.begin()
        return resp.status, resp.read(), sent


def test_a_body_past_the_limit_without_a_token_gets_413_before_it_is_read_whole(hub):
    """Any method, any path under the service (routed or not, the OAuth callback, the prefix's
    redirect), a declared or chunked body from 4 KiB + 1 to 1 TiB, no valid token: 413 naming the
    limit, answered before the rest of a body larger than 16 KiB is sent."""
    watch, tally = LogWatch(hub.hub_log), Tally("hub service bodies past the limit, no token")
    host, port = "127.0.0.1", urllib.parse.urlparse(hub.url).port or 80

    def attempt(_: int, case: tuple[str, str, int, str, str]) -> tuple[int, str]:
        status, raw, sent = send_big_body(host, port, case)
        if status != 413:
            return status, f"{status}, not 413, after {sent} of {case[2]} bytes: {raw[:300]!r}"
        if str(MAX_BODY).encode() not in raw:
            return status, f"413 that does not name the limit: {raw[:300]!r}"
        return status, ""

    door(tally, watch, cases_of(BIG_BODIES), attempt)


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


def refused_in_json(status: int, raw: bytes, what: object) -> str:
    """An answer to a write that must be refused: a 4xx whose JSON names the problem."""
    if not 400 <= status < 500:
        return f"{status}, not a 4xx, for {what!r:.100}: {raw[:300]!r}"
    try:
        return "" if json.loads(raw)["message"] else "an empty message"
    except (ValueError, KeyError, TypeError):
        return f"{status} whose JSON has no message: {raw[:300]!r}"


def test_keep_answers_every_body_without_a_5xx_and_keeps_nothing_it_refused(hub, service_url):
    """``POST api/v1/me/keep``, the service's one door that writes: any body, as a user with no
    idle slice. Every answer is a 4xx naming the problem (400 for a body that is not the form,
    404 for a well-formed one: nothing of this user's is idle, 413 past 4 KiB), and no Keep is
    stored."""
    watch, tally = LogWatch(hub.hub_log), Tally("hub service keep")
    sessions = clients(service_url, hub.user_token("fuzzy-keeper"))

    def attempt(worker: int, body: bytes) -> tuple[int, str]:
        resp = sessions[worker].send("POST", f"/services/{SERVICE}/api/v1/me/keep", body)
        raw = resp.read()
        return resp.status, refused_in_json(resp.status, raw, body)

    assert "pressed Keep" not in door(tally, watch, cases_of(BODIES), attempt)


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
BUDGET_CASES = st.tuples(BUDGET_NAMES.filter(lambda name: name not in BUDGET_USERS), BUDGET_BODIES)


@pytest.mark.parametrize("who", ["user", "admin"])
def test_budget_additions_answer_every_body_and_name_without_a_5xx_and_add_nothing_they_refused(
    hub, service_url, who
):
    """``POST api/v1/budgets/<user>``, the admins' door that writes: any body, any name. A user
    gets 403; the admin gets 400 for a body that is not ``{"add_gib_hours": <number>}``, 404 for a
    name the hub does not know, 409 for a user without a budget; nothing is added to anyone."""
    watch, tally = LogWatch(hub.hub_log), Tally(f"hub service budget additions as {who}")
    admin = hub.user_token(SERVICE_ADMIN)
    sessions = clients(service_url, hub.user_token("fuzzy-budget" if who == "user" else SERVICE_ADMIN))
    before = added(hub, admin)

    def attempt(worker: int, case: tuple[str, bytes]) -> tuple[int, str]:
        name, body = case
        resp = sessions[worker].send(
            "POST", f"/services/{SERVICE}/api/v1/budgets/" + urllib.parse.quote(name, safe=""), body
        )
        raw = resp.read()
        wrong = refused_in_json(resp.status, raw, case)
        if not wrong and who == "user" and resp.status not in (403, 404):
            wrong = f"{resp.status} for a user, not 403 (or 404 for a path no route serves): {raw[:300]!r}"
        return resp.status, wrong

    text = door(tally, watch, cases_of(BUDGET_CASES), attempt)
    assert "'s GPU budget for the" not in text  # the service logs every addition
    assert added(hub, admin) == before, "a refused addition changed someone's budget"


def added(hub: Any, admin: str) -> dict[str, float]:
    """What admins added to each user's window so far (other tests of the session add some)."""
    status, doc = hub.request("GET", f"{hub.url}/services/{SERVICE}/api/v1/budgets", admin)
    assert status == 200, (status, doc)
    return {row["user"]: row["added_gib_hours"] for row in doc["users"]}
