"""Hibernation's doors (issue 46), each at the fuzz tier's count of seeded cases:

* ``ask.json``, which a notebook container writes into its door on an overcommitting node: any
  bytes (JSON of every shape, wrong types, huge numbers, junk) are read by the plugin's
  ``read_ask`` without an exception, and fed with hostile measurements to its arbiter, which
  keeps every card's awake slices within the card and answers every pod;
* ``answer.json`` as the notebook reads it (a node's plugin could be old or broken): never an
  exception, never a grant from anything but ``"grant": true``;
* the notebook server's ``POST gpushare/api/hibernation/<kernel>`` body: a 4xx that says what was
  wrong, or one of the four actions; never another exception.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from tornado import web

from gpushare_hub.core.arbiter import Measured, Situation, Slice, decide
from gpushare_hub.core.overcommit import AWAKE, Book, read_answer, read_ask
from gpushare_hub.notebook.wakeonrun import ACTIONS, action_of
from tests.support.fuzzing import any_text, seeded_cases

from .conftest import CASES, SEED, report

pytestmark = pytest.mark.fuzz
GIB = 1024
CARD = "GPU-0"
REAL = {CARD: 15 * GIB}
KEYS = (
    "hibernated",
    "wake",
    "idle_seconds",
    "state",
    "grant",
    "place",
    "ahead",
    "words",
    "hibernate_now",
    "action",
)


def any_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 2 else 7)
    if kind == 0:
        return rng.choice([True, False, None])
    if kind == 1:
        return rng.choice([0, 1, -1, 2**63, -(2**63), 10**400 if rng.random() < 0.1 else 7])
    if kind == 2:
        return rng.choice([0.5, -0.0, 1e308, float("inf"), float("nan")])
    if kind in (3, 4):
        return any_text(rng, 40)
    if kind in (5, 6):
        return rng.choice(["awake", "hibernated", "hibernate", "wake", "keep-awake", "allow-sleep", ""])
    if kind == 7:
        return [any_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(KEYS): any_value(rng, depth + 1) for _ in range(rng.randrange(5))}


def any_body(rng: random.Random) -> bytes:
    """A door file's or a request's bytes: mostly JSON objects of our keys, else anything."""
    r = rng.random()
    if r < 0.7:
        doc = {rng.choice(KEYS): any_value(rng) for _ in range(rng.randrange(6))}
        text = json.dumps(doc, allow_nan=True)
    elif r < 0.85:
        text = json.dumps(any_value(rng), allow_nan=True)
    elif r < 0.95:
        text = any_text(rng, 200)
    else:
        text = "[" * rng.randrange(1, 5000)  # deep nesting
    raw = text.encode("utf-8", "surrogatepass")
    return raw if rng.random() < 0.97 else raw * rng.randrange(2, 5000)  # sometimes too long


def an_ask(rng: random.Random) -> bytes:
    """Half the asks well formed (any states, any idle time), half anything."""
    if rng.random() < 0.5:
        return any_body(rng)
    doc = {
        "hibernated": rng.random() < 0.5,
        "wake": rng.random() < 0.5,
        "idle_seconds": rng.choice([0, 5, 299, 301, 10**6]),
    }
    return json.dumps(doc).encode()


def test_any_ask_is_read_without_error_and_the_arbiter_keeps_the_card():
    cases = seeded_cases(an_ask, CASES, SEED)
    names = [f"pod-{i}" for i in range(6)]
    book, now, read = Book(), 0.0, 0
    rng = random.Random(SEED)
    for i, raw in enumerate(cases):
        ask = read_ask(raw)
        read += ask is not None
        now += rng.randrange(1, 120)
        pods = {n: Slice(f"jhub/{n}", {CARD: (3, 5, 7)[j % 3] * GIB}) for j, n in enumerate(names)}
        asks = {names[i % len(names)]: ask} if ask is not None else {}
        measured = {
            n: Measured(rng.choice([0, 512, 5 * GIB, 20 * GIB]), rng.choice([0, 0, 30]), now - 0.5)
            for n in rng.sample(names, rng.randrange(len(names) + 1))
        }
        d = decide(book, Situation(REAL, pods, asks, measured, now, GIB, 300))
        awake = sum(r.mib for r in d.book.pods.values() if r.state == AWAKE)
        assert awake <= REAL[CARD], (raw[:200], d.book)
        assert set(d.answers) == set(pods)
        book = d.book
    report(f"ask.json: {CASES} bodies, {read} of the right shape; the card never over its memory awake")


def test_any_answer_is_read_without_error_and_grants_only_when_it_says_so():
    cases = seeded_cases(any_body, CASES, SEED + 1)
    granted = 0
    for raw in cases:
        answer = read_answer(raw)
        if answer is None:
            continue
        doc = json.loads(raw)
        assert answer.grant is (doc.get("grant") is True)
        granted += answer.grant
    report(f"answer.json: {CASES} bodies, {granted} grants, each written as one")


def test_the_hibernation_api_refuses_any_bad_body_with_a_4xx_naming_it():
    cases = seeded_cases(any_body, CASES, SEED + 2)
    refused = 0
    for raw in cases:
        try:
            action = action_of(raw)
        except web.HTTPError as err:
            assert 400 <= err.status_code < 500 and err.log_message, raw[:200]
            refused += 1
            continue
        assert action in ACTIONS
    report(f"POST gpushare/api/hibernation/<kernel>: {CASES} bodies, {refused} refused with a 4xx")
