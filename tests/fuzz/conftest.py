"""Fuzz tier: every door driven with malformed input against the real component behind it.

Each door's test mutates valid requests (seeded: the same cases on every run), sends them, and
asserts no 5xx, no traceback in the component's log, the component still answering, and its
state unchanged by what it refused. It prints the counts per door (run with ``-s`` to see them).
Doors that :func:`drive` their cases send them concurrently, as they are drawn.
"""

from __future__ import annotations

import http.client
import os
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

# Each door's line of counts, printed at the end of every run that drove a door (CI's log too).
COUNTS: list[str] = []


def report(line: str) -> None:
    COUNTS.append(line.strip())
    print("\n" + line.strip())


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if COUNTS:
        terminalreporter.section("fuzz: counts per door")
        for line in COUNTS:
            terminalreporter.write_line(line)


# Cases per door in CI (the floor); FUZZ_CASES overrides it for a quick local run.
CASES = int(os.environ.get("FUZZ_CASES", 10_000))


def seeded(test: Callable[..., None]) -> Callable[..., None]:
    """A door's cases: the same ones on every run (seeded, no example database), no deadline."""
    return seed(22025)(
        settings(
            max_examples=CASES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )(test)
    )


# Cases in flight at once at a door that drives them (FUZZ_WORKERS overrides it).
WORKERS = int(os.environ.get("FUZZ_WORKERS", 12))
Case = TypeVar("Case")


# Each strategy's seeded cases, drawn once per session (strategy, cases), by id of the strategy.
_DRAWN: dict[int, tuple[st.SearchStrategy[Any], list[Any]]] = {}


def _draw(cases: st.SearchStrategy[Case], each: Callable[[Case], object]) -> list[Case]:
    """The seeded cases of ``cases`` (:func:`seeded`: the same ones on every run), ``each`` called
    with every one as it is drawn. A strategy is drawn once per session: a door that drives it
    again (another kind of caller at the same routes) gets the same cases, as a second draw
    would give them, without drawing them again (the draw is most of a door's time)."""
    known = _DRAWN.get(id(cases))
    if known is not None:
        for case in known[1]:
            each(case)
        return known[1]
    drawn: list[Case] = []

    @seeded
    @given(case=cases)
    def draw(case: Case) -> None:
        drawn.append(case)
        each(case)

    draw()
    _DRAWN[id(cases)] = (cases, drawn)
    return drawn


def drawn(cases: st.SearchStrategy[Case]) -> list[Case]:
    """The seeded cases of ``cases`` (see :func:`_draw`)."""
    return _draw(cases, lambda _: None)


def drive(
    tally: Tally,
    cases: st.SearchStrategy[Case] | Sequence[Case],
    attempt: Callable[[Case], tuple[int, str]],
) -> None:
    """Send a door's cases concurrently and count their answers in ``tally``.

    The cases (a strategy's, drawn as :func:`_draw` draws them: the draw never depends on an
    answer; or a list made from such cases) are handed to :data:`WORKERS` threads as they are
    drawn. ``attempt(case)`` sends one and says what was wrong with the answer (``""``: nothing),
    with its status. Every case is sent and checked; the failures are listed at the end, the
    first ones whole (the case and the problem), instead of a shrunk example."""
    sent: list[tuple[Case, Future[tuple[int, str]]]] = []
    started = time.perf_counter()
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="fuzz") as pool:

        def submit(case: Case) -> None:
            sent.append((case, pool.submit(_answered, attempt, case)))

        if isinstance(cases, st.SearchStrategy):
            _draw(cases, submit)
        else:
            for case in cases:
                submit(case)
        failed: list[str] = []
        for case, answer in sent:
            status, problem = answer.result()
            tally.add(status)
            if problem:
                failed.append(f"{case!r:.400}: {problem}")
    tally.seconds = time.perf_counter() - started
    assert not failed, f"{tally.door}: {len(failed)} of {len(sent)} cases failed:\n" + "\n".join(failed[:5])


def _answered(attempt: Callable[[Case], tuple[int, str]], case: Case) -> tuple[int, str]:
    try:
        return attempt(case)
    except (OSError, http.client.HTTPException) as err:  # no answer at all: a failure too
        return 0, f"no answer: {type(err).__name__}: {err}"


def per_thread(make: Callable[[], Any]) -> Callable[[], Any]:
    """``make()``'s object for the calling thread, made on its first call there (one keep-alive
    connection per worker)."""
    local = threading.local()

    def mine() -> Any:
        if not hasattr(local, "it"):
            local.it = make()
        return local.it

    return mine


class LogWatch:
    """What a component wrote to its log since the watch began, and the tracebacks in it."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.start = log.stat().st_size

    def added(self) -> str:
        with self.log.open("rb") as f:
            f.seek(self.start)
            return f.read().decode(errors="replace")

    def first_traceback(self) -> tuple[int, str]:
        text = self.added()
        return text.count("Traceback"), text[text.find("Traceback") :][:3000]

    def tracebacks(self, upstream: tuple[str, ...]) -> tuple[int, int, str]:
        """(ours, upstream's, the first of ours): a traceback whose log line (the line before it)
        holds one of ``upstream`` is a third party's own logging of input it refused, outside our
        code (JupyterHub logs every body that is not JSON with its traceback)."""
        lines = self.added().splitlines()
        ours, theirs, first = 0, 0, ""
        for i, line in enumerate(lines):
            if not line.lstrip().startswith("Traceback"):
                continue
            if i and any(words in lines[i - 1] for words in upstream):
                theirs += 1
                continue
            ours += 1
            first = first or "\n".join(lines[max(0, i - 1) : i + 40])
        return ours, theirs, first


class HubClient:
    """One keep-alive connection to the hub's proxy, with a token; opened again once when the
    other side closed it (a case may make the server drop the connection)."""

    def __init__(self, url: str, token: str, timeout: float = 30) -> None:
        u = urllib.parse.urlparse(url)
        self.host, self.port, self.timeout = u.hostname or "127.0.0.1", u.port or 80, timeout
        self.token = token
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def send(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> http.client.HTTPResponse:
        """The response, its body not read yet; with the token unless ``headers`` are given."""
        headers = dict(headers) if headers is not None else {"Authorization": f"token {self.token}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            self.conn.request(method, path, body=body, headers=headers)
            return self.conn.getresponse()
        except (http.client.HTTPException, ConnectionError):
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.conn.request(method, path, body=body, headers=headers)
            return self.conn.getresponse()


class Tally:
    """Statuses seen at one door, printed at the end."""

    def __init__(self, door: str) -> None:
        self.door = door
        self.statuses: Counter[int] = Counter()
        self.seconds: float | None = None

    def add(self, status: int) -> None:
        self.statuses[status] += 1

    def line(self, tracebacks: int) -> str:
        server_errors = sum(n for s, n in self.statuses.items() if s >= 500)
        shown = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        took = "" if self.seconds is None else f" in {self.seconds:.0f} s"
        return (
            f"fuzz {self.door}: {sum(self.statuses.values())} cases, {server_errors} x 5xx, "
            f"{tracebacks} tracebacks ({shown}){took}"
        )


# The hub tier's session hub (with the gpushare hub service), for the doors behind JupyterHub.
from tests.hub.conftest import hub, notebook_nodes  # noqa: E402, F401
