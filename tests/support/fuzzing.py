"""A fuzz door's seeded cases drawn first, then sent side by side.

Drawing is Hypothesis's, with the door's seed and count: the same cases as a door that sends each
one inside its ``@given`` test (the draw keeps exactly the cases the door's ``assume`` keeps).
Sending is the door's own, from several workers at once, each with its own connection (for the
hub, its own user), so the component answers one case while the next is on its way. (Drawing
while sending was slower: the drawing thread holds the GIL the senders need.) Every case is
checked as before; failures are gathered and reported with their cases (the first five) rather
than shrunk.

Doors whose cases cost more to draw with Hypothesis than to send (the device plugin's, whose calls
hold up to 300 containers of ID lists) draw them from a seeded ``random.Random`` instead
(``seeded_cases``, ``any_text``): the same cases on every run, about a thousand times faster.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from hypothesis import assume, given
from hypothesis import strategies as st

T = TypeVar("T")


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


def drawn(strategy: st.SearchStrategy[T], keep: Callable[[T], bool], seeded: Callable[[Any], Any]) -> list[T]:
    """The cases ``seeded`` (a door's settings: seed, count) draws from ``strategy`` that ``keep``
    accepts (the door's ``assume``), in order."""
    cases: list[T] = []

    @seeded
    @given(strategy)
    def draw(case: T) -> None:
        assume(keep(case))
        cases.append(case)

    draw()
    return cases


def send_all(cases: Sequence[T], workers: int, check: Callable[[int, T], None]) -> Failures:
    """``check(worker, case)`` for every case, from ``workers`` threads side by side: worker ``i``
    sends cases ``i``, ``i + workers`` ... one at a time. Returns what failed (an exception other
    than an assertion too)."""
    failures = Failures()

    def work(worker: int) -> None:
        for case in cases[worker::workers]:
            try:
                check(worker, case)
            except Exception as err:  # an assertion or the connection's own trouble: reported
                failures.add(case, err)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for sender in [pool.submit(work, i) for i in range(workers)]:
            sender.result()
    return failures


# Characters a hostile caller writes: ASCII, controls (NUL included), Latin-1, the rest of the BMP
# and beyond it; never a lone surrogate (not encodable as UTF-8, so no client could send one).
_RANGES = [(0x20, 0x7E), (0x00, 0x1F), (0x7F, 0xFF), (0x100, 0xD7FF), (0xE000, 0xFFFD), (0x10000, 0x10FFFF)]


def any_text(rng: random.Random, max_size: int) -> str:
    """Text of 0 to ``max_size`` characters, each from one of _RANGES (ASCII most often)."""
    out = []
    for _ in range(rng.randint(0, max_size)):
        lo, hi = _RANGES[0] if rng.random() < 0.5 else rng.choice(_RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def seeded_cases(make: Callable[[random.Random], T], count: int, seed: int) -> list[T]:
    """``count`` cases from ``make``, drawn in turn from one ``random.Random(seed)``."""
    rng = random.Random(seed)
    return [make(rng) for _ in range(count)]
