"""Every input of the hub service read, bounded and refused before work is done (issue 35):
query parameters that answered 500 or stalled the service's loop, bodies refused with 413 as they
stream in (before authentication), tables pruned and read per user, state files 0600. Through the
service's real application behind a fake hub (tests/support)."""

from __future__ import annotations

import asyncio
import socket
import stat
import time

import pytest

from gpushare_hub.accounting.book import Book
from gpushare_hub.accounting.records import IdleAction
from gpushare_hub.core.planning import PlanningError, parse_cards_range, parse_catalogue
from gpushare_hub.service.budgets import BudgetRule
from gpushare_hub.service.enforcement import Enforcement
from gpushare_hub.service.held import HeldSlice
from gpushare_hub.service.idle import IdleRule
from gpushare_hub.service.idlepolicy import IdlePolicy
from tests.support.hubservice import ServiceUnderTest, own_token


@pytest.fixture
def admin(hub_service: ServiceUnderTest) -> ServiceUnderTest:
    hub_service.callers["admin"] = own_token("boss", admin=True)
    return hub_service


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("catalogue=%C2%B2", "catalogue"),  # '²': str.isdigit() is true of it, int() fails
        ("catalogue=%D9%A3", "catalogue"),  # '٣', an Arabic-Indic three
        ("cards=1.." + "9" * 190, "cards"),
        ("cards=1..99999999999", "cards"),
        ("cards=1..200000000", "cards"),
        ("cards=%C2%B2", "cards"),
        ("since=0001-01-01T00:00:00%2B05:00", "since"),  # before year 1 in UTC
        ("until=9999-12-31T23:59:59-23:59", "until"),  # after year 9999 in UTC
    ],
)
def test_planning_answers_400_naming_the_parameter_at_once(admin, query, param):
    started = time.monotonic()
    status, body = admin.call("GET", f"api/v1/planning?{query}", "admin")
    assert status == 400 and param in body["message"], (query, status, body)
    assert time.monotonic() - started < 2, "the parameter was not bounded before work was done"


def test_history_refuses_a_time_outside_the_years_it_can_write(admin):
    status, body = admin.call("GET", "api/v1/history?since=0001-01-01T00:00:00%2B05:00", "admin")
    assert status == 400 and "since" in body["message"], (status, body)


def test_counts_and_sizes_are_ascii_digits_bounded_before_any_list_is_made():
    with pytest.raises(PlanningError, match="cards: 99999999999 is not from 1 to 4096"):
        parse_cards_range("1..99999999999")
    with pytest.raises(PlanningError, match=r"\(191 digits\) is not from 1"):
        parse_cards_range("1.." + "9" * 191)
    with pytest.raises(PlanningError, match="cannot read"):
        parse_cards_range("1..²")
    with pytest.raises(PlanningError, match="cannot read '٣'"):
        parse_catalogue("٣")
    assert parse_cards_range("4..6") == [4, 5, 6] and parse_catalogue("5,3") == (3, 5)


def keep_body(size: int) -> bytes:
    return b'{"server": "' + b"a" * (size - 14) + b'"}'


def test_a_body_past_the_limit_is_refused_with_413_before_authentication(hub_service):
    # No token at all: the refusal comes before the service asks the hub who this is.
    status, body = hub_service.call("POST", "api/v1/me/keep", None, keep_body(5000))
    assert status == 413 and "4096" in body["message"], (status, body)
    # Within the limit, the same caller is asked for a token.
    status, body = hub_service.call("POST", "api/v1/me/keep", None, keep_body(4000))
    assert status == 401, (status, body)


def test_a_declared_length_past_the_limit_is_refused_before_a_byte_of_the_body_is_sent(hub_service):
    with socket.create_connection(("127.0.0.1", hub_service.port), timeout=5) as conn:
        conn.sendall(
            b"POST /services/gpushare/api/v1/budgets/x HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 104857600\r\n\r\n"
        )
        answer = conn.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


@pytest.mark.parametrize(
    "path",
    [
        "/services/gpushare/metrics/x",  # no route: tornado's own 404 would read the body whole
        "/services/gpushare/oauth_callback",
        "/services/gpushare",  # redirected to the dashboard
        "/services/gpushare/",
        "/elsewhere",
    ],
)
def test_every_path_refuses_a_large_body_before_it_is_sent_routed_or_not(hub_service, path):
    with socket.create_connection(("127.0.0.1", hub_service.port), timeout=5) as conn:
        conn.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n".encode())
        conn.sendall(b"a" * 5000)
        answer = conn.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), (path, answer[:200])


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit(hub_service):
    with socket.create_connection(("127.0.0.1", hub_service.port), timeout=5) as conn:
        conn.sendall(
            b"POST /services/gpushare/api/v1/me/keep HTTP/1.1\r\nHost: x\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        for _ in range(3):  # 6000 bytes of a body that never ends
            conn.sendall(b"7d0\r\n" + b"a" * 2000 + b"\r\n")
        answer = conn.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


@pytest.mark.parametrize("framing", ["Content-Length: 104857600", "Transfer-Encoding: chunked"])
def test_a_client_still_sending_after_the_refusal_is_not_reset(hub_service, framing):
    """The rest of a refused body is read and dropped for a while: a connection closed with
    unread bytes is reset, and a proxy in front (configurable-http-proxy) that was still sending
    the body reported the reset as a 503 of its own instead of the 413."""
    chunked = "chunked" in framing
    piece = b"800\r\n" + b"a" * 2048 + b"\r\n" if chunked else b"a" * 2048
    with socket.create_connection(("127.0.0.1", hub_service.port), timeout=5) as conn:
        head = f"POST /services/gpushare/api/v1/me/keep HTTP/1.1\r\nHost: x\r\n{framing}\r\n\r\n"
        conn.sendall(head.encode() + piece * 3)
        answer = b""
        while b"4096" not in answer:
            more = conn.recv(4096)
            assert more, answer
            answer += more
        assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
        for _ in range(10):  # 200 KiB more after the answer: EPIPE or a reset once it is closed
            conn.sendall(piece * 10)
            time.sleep(0.02)


def test_a_refused_body_is_dropped_for_a_bounded_while_then_the_connection_is_closed(
    hub_service, monkeypatch
):
    from gpushare_hub.web import bodylimit

    monkeypatch.setattr(bodylimit, "LINGER_SECONDS", 0.5)
    with socket.create_connection(("127.0.0.1", hub_service.port), timeout=5) as conn:
        conn.sendall(
            b"POST /services/gpushare/api/v1/me/keep HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000\r\n\r\n"
        )
        started = time.monotonic()
        answer = b""
        while True:  # the answer, then the close once the linger is over
            more = conn.recv(4096)
            if not more:
                break
            answer += more
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert 0.4 < time.monotonic() - started < 3


def test_the_state_files_are_readable_by_their_owner_only(hub_service, tmp_path):
    assert stat.S_IMODE(hub_service.state_db.stat().st_mode) == 0o600
    # A file an older version left readable by all is tightened when it is opened again.
    old = tmp_path / "old.sqlite"
    old.touch(mode=0o644)
    old.chmod(0o644)
    Book(old).close()
    assert stat.S_IMODE(old.stat().st_mode) == 0o600
    for side in tmp_path.glob("state/*"):
        assert stat.S_IMODE(side.stat().st_mode) == 0o600, side


NOW = 1_800_000_000


def test_keep_presses_and_idle_actions_older_than_the_retention_are_dropped(tmp_path):
    store = Book(tmp_path / "s.sqlite")
    day = 86400
    store.keep("ann", "", "old", NOW - 100 * day, NOW - 101 * day)
    store.keep("ann", "", "new", NOW + 3600, NOW)
    store.record_idle(IdleAction("ann", "", "old", "stopped", "t4-5g", 5, NOW - 100 * day, 7200))
    store.record_idle(IdleAction("ann", "", "new", "stopped", "t4-5g", 5, NOW - day, 7200))
    passes = Enforcement(store, IdleRule(), BudgetRule(), None, retention_days=90, clock=lambda: NOW)
    asyncio.run(passes.run_pass([], {}))
    assert store.keeps(["ann"]) == {("ann", "", "new"): NOW + 3600}
    assert [a.stretch for a in store.returned("ann", 0)] == ["new"]


def test_the_idle_states_read_only_the_keep_presses_of_the_users_they_are_about(tmp_path):
    store = Book(tmp_path / "s.sqlite")
    for i in range(50):
        store.keep(f"user-{i}", "", "s", NOW + 3600, NOW)
    asked: list[list[str]] = []
    keeps = store.keeps
    store.keeps = lambda users: asked.append(sorted(users)) or keeps(users)  # type: ignore[method-assign]
    IdlePolicy(IdleRule(), store).states([HeldSlice("hub", "p", "user-7", "", 5)], {}, NOW)
    assert asked == [["user-7"]]
