"""The fuzz doors' cases drawn first and sent side by side (tests/support/fuzzing.py): the same
seeded cases as a door that sends each one inside its ``@given`` test, every one checked once, and
every failure reported with its case."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, assume, given, seed, settings
from hypothesis import strategies as st

from tests.support.fuzzing import drawn, send_all

CASES = 300
STRATEGY = st.lists(st.integers(-50, 50), max_size=4) | st.text(max_size=5)


def seeded(test: Any) -> Any:
    return seed(7)(
        settings(max_examples=CASES, deadline=None, database=None, derandomize=True,
                 suppress_health_check=list(HealthCheck))(test)
    )  # fmt: skip


def keep(case: Any) -> bool:
    return not (isinstance(case, list) and len(case) == 1)


def inline_cases(keep: Any) -> list[Any]:
    """The cases a door that sends inside its ``@given`` test would send."""
    seen: list[Any] = []

    @seeded
    @given(STRATEGY)
    def door(case: Any) -> None:
        assume(keep(case))
        seen.append(case)

    door()
    return seen


def test_the_cases_sent_are_those_a_given_test_is_called_with():
    inline = inline_cases(keep)
    sent: list[tuple[int, Any]] = []
    lock = threading.Lock()

    def check(worker: int, case: Any) -> None:
        with lock:
            sent.append((worker, case))

    cases = drawn(STRATEGY, keep, seeded)
    failures = send_all(cases, 4, check)
    assert len(cases) == len(inline) == len(sent) == CASES and not failures
    assert cases == inline
    assert Counter(map(repr, inline)) == Counter(repr(case) for _, case in sent)
    assert {worker for worker, _ in sent} == {0, 1, 2, 3}  # side by side


def bad(case: Any) -> bool:
    return (isinstance(case, str) and "a" in case) or case == [13]


def test_every_failing_case_is_reported_with_its_case():
    def check(worker: int, case: Any) -> None:
        assert not (isinstance(case, str) and "a" in case), case
        if case == [13]:
            raise ConnectionResetError("the door dropped the connection")

    cases = drawn(STRATEGY, lambda case: True, seeded)
    failures = send_all(cases, 3, check)
    expected = [case for case in cases if bad(case)]
    assert len(cases) == CASES and expected
    assert Counter(repr(case) for case, _ in failures.seen) == Counter(map(repr, expected))
    assert str(failures).startswith(f"{len(expected)} cases failed")
