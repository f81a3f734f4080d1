"""A fuzz door's seeded cases drawn in one thread and sent side by side from several.

Drawing is Hypothesis's, with the door's seed and count: the same cases as a door that sends each
one inside its ``@given`` test (the draw keeps exactly the cases the door's ``assume`` keeps).
Sending is the door's own, from several workers at once, each with its own connection (for the
hub, its own user), so the component answers one case while the next is drawn and on its way.
Every case is checked as before; failures are gathered and reported with their cases (the first
five) rather than shrunk.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from hypothesis import assume, given
from hypothesis import strategies as st

T = TypeVar("T")
_DONE = object()  # after the last case: the senders stop


class Failures:
    """What failed, case by case, across workers (the first few are shown)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[Any, BaseException]] = []

    def add(self, case: Any, err: BaseException) -> None:
        with self.lock:
            self.seen.append((case, err))

    def __bool__(self) -> bool:
        return bool(self.seen)

    def __str__(self) -> str:
        shown = "\n".join(
            f"- {case!r:.300}: {type(err).__name__}: {err!s:.600}" for case, err in self.seen[:5]
        )
        return f"{len(self.seen)} cases failed; the first:\n{shown}"


def draw_and_send(
    strategy: st.SearchStrategy[T],
    keep: Callable[[T], bool],
    seeded: Callable[[Any], Any],
    workers: int,
    check: Callable[[int, T], None],
) -> tuple[int, Failures]:
    """Draw the cases ``seeded`` (a door's settings: seed, count) draws from ``strategy`` that
    ``keep`` accepts (the door's ``assume``), in this thread, while ``workers`` threads send them:
    ``check(worker, case)`` for each, the next case to the first worker free. Returns how many
    cases were drawn and what failed (an exception other than an assertion too)."""
    todo: queue.Queue[Any] = queue.Queue(maxsize=workers * 50)
    failures = Failures()
    drawn = 0

    def work(worker: int) -> None:
        while (case := todo.get()) is not _DONE:
            try:
                check(worker, case)
            except Exception as err:  # an assertion or the connection's own trouble: reported
                failures.add(case, err)

    @seeded
    @given(strategy)
    def draw(case: T) -> None:
        nonlocal drawn
        assume(keep(case))
        todo.put(case)
        drawn += 1

    with ThreadPoolExecutor(max_workers=workers) as pool:
        senders = [pool.submit(work, i) for i in range(workers)]
        try:
            draw()
        finally:
            for _ in senders:
                todo.put(_DONE)
        for sender in senders:
            sender.result()
    return drawn, failures
