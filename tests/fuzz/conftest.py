"""Fuzz tier: every door driven with malformed input against the real component behind it.

Each door's test mutates valid requests (seeded: the same cases on every run), sends them, and
asserts no 5xx, no traceback in the component's log, the component still answering, and its
state unchanged by what it refused. It prints the counts per door (run with ``-s`` to see them).
Doors may draw their cases first and send them side by side (tests/support/fuzzing.py).
"""

from __future__ import annotations

import http.client
import os
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, seed, settings

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
# Every door's seed: the same cases on every run.
SEED = 22025


def seeded(test: Callable[..., None]) -> Callable[..., None]:
    """A door's cases: the same ones on every run (seeded, no example database), no deadline."""
    return seed(SEED)(
        settings(
            max_examples=CASES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )(test)
    )


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
        self.started = time.perf_counter()
        self.lock = threading.Lock()  # doors that send side by side count from several threads

    def add(self, status: int) -> None:
        with self.lock:
            self.statuses[status] += 1

    def line(self, tracebacks: int) -> str:
        server_errors = sum(n for s, n in self.statuses.items() if s >= 500)
        shown = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        took = f" in {time.perf_counter() - self.started:.0f} s"  # the door's time, its draw included
        return (
            f"fuzz {self.door}: {sum(self.statuses.values())} cases, {server_errors} x 5xx, "
            f"{tracebacks} tracebacks ({shown}){took}"
        )
