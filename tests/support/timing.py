"""Each tier's time in one pytest session, for the table `make test` ends with
(:mod:`gpushare_hub.localcluster.timing`), and in pytest's own summary.

A tier is a folder of tests/; its time is the sum of its tests' setup, call and teardown (a
session fixture's start-up counts in the first tier that asks for it). The slowest tests are
recorded too, with the first line of their docstring: what they are slow to prove.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare_hub.localcluster import build, timing

# A test this slow is listed in the table by name, with what its docstring says it proves.
SLOW_SECONDS = 20.0


class TierClock:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.seconds: Counter[str] = Counter()
        self.tests: Counter[str] = Counter()
        self.first: dict[str, float] = {}
        self.slow: list[tuple[str, float, float, str]] = []
        self.start = time.time()
        self.began = time.monotonic()

    def tier(self, item: pytest.Item) -> str:
        try:
            parts = item.path.relative_to(self.root).parts
        except ValueError:
            return "other"
        return parts[0] if len(parts) > 1 else "other"

    def add(self, item: pytest.Item, start: float, seconds: float) -> None:
        tier = self.tier(item)
        self.first.setdefault(tier, start)
        self.seconds[tier] += seconds
        self.tests[tier] += 1
        if seconds >= SLOW_SECONDS:
            doc = (getattr(getattr(item, "obj", None), "__doc__", None) or "").strip()
            self.slow.append((item.nodeid, start, seconds, " ".join(doc.split("\n\n")[0].split())))


_KEY = pytest.StashKey[TierClock]()


def _label() -> str:
    """`` @ v1.37.2`` when the session runs against a Kubernetes version other than the first."""
    chosen = os.environ.get(build.VERSION_ENV)
    return f" @ {build.Versions.load().kubernetes}" if chosen else ""


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_KEY] = TierClock(config.rootpath / "tests")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    start, began = time.time(), time.monotonic()
    yield
    item.config.stash[_KEY].add(item, start, time.monotonic() - began)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    clock = config.stash[_KEY]
    if not clock.tests:
        return
    terminalreporter.section("time per tier (wall seconds: setup, call and teardown summed)")
    for tier, seconds in sorted(clock.seconds.items(), key=lambda kv: clock.first[kv[0]]):
        terminalreporter.write_line(f"{tier + _label():<24} {clock.tests[tier]:>6} tests {seconds:>9.1f} s")


def pytest_sessionfinish(session: pytest.Session) -> None:
    clock = session.config.stash[_KEY]
    if not clock.tests or not os.environ.get(timing.TIMING_ENV):
        return
    label = _label()
    root = session.config.rootpath
    args = " ".join(os.path.relpath(a, root) if os.path.isabs(a) else a for a in session.config.args)
    total = sum(clock.tests.values())
    timing.record("session", f"pytest {args}{label}", str(total), clock.start, time.monotonic() - clock.began)
    for tier, seconds in sorted(clock.seconds.items(), key=lambda kv: clock.first[kv[0]]):
        timing.record("tier", tier + label, str(clock.tests[tier]), clock.first[tier], seconds)
    for nodeid, start, seconds, doc in clock.slow:
        timing.record("slow", nodeid + label, "", start, seconds, doc)
