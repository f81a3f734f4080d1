"""Overcommit: a card holds more notebooks than its memory, its idle ones hibernated (pure).

On a node whose device plugin runs with an overcommit factor ``F`` above 1 (issue 46, part 3),
every slice on a card is *held* (at most ``F`` x the card) and each is either *awake* (its GPU
memory on the card) or *hibernated* (checkpointed into host memory by the notebook's Jupyter
extension). The awake slices of a card never sum above the card's memory as sold (``real``:
MiB after any reserve). This module holds the arithmetic and the wire shapes; the decisions are
:mod:`.arbiter`'s, the I/O the plugin's (:mod:`gpushare_hub.plugin.hibernation`).

* **Capacity** (:func:`declared_mib`): the plugin declares each card on its Node
  (``gpushare-hub.io/cards``) as ``min(real + h, F x real)``, ``h`` the hibernated MiB counted
  on the card, so that the extender, unchanged, places a new slice only where it fits awake
  (held - h <= real) and held <= F x real. The hibernated MiB counted on a node never exceed the
  host memory the admin set aside (``--hibernation-host-memory-gib``): each card first gets what
  its held slices already need beyond its memory, then the rest goes card by card in UUID order.
* **The book** (:class:`Book`, the Node annotation ``gpushare-hub.io/hibernation``, written by the
  plugin and read back at its start): each pod's state, since when, card and slice, and each
  card's line of pods waiting to wake.
* **The door**: the notebook writes ``ask.json`` (:func:`ask_json`; the plugin reads it with
  :func:`read_ask`, untrusted, at most :data:`MAX_ASK_BYTES`), the plugin answers ``answer.json``
  (:class:`Answer`, read by the notebook with :func:`read_answer`), written again after each new
  ask: an answer whose file is not older than the ask answers it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_OVERCOMMIT = 4.0
AWAKE = "awake"
HIBERNATED = "hibernated"
ASK_FILE = "ask.json"
ANSWER_FILE = "answer.json"
MAX_ASK_BYTES = 4096
# The book of a node: a few hundred pods at most; bounded all the same (the annotation is ours,
# but a reader does not trust a Node's annotation's size or shape).
MAX_BOOK_CHARS = 1_000_000
MAX_BOOK_PODS = 10_000


@dataclass(frozen=True)
class Overcommit:
    """A node's overcommit settings: ``factor`` (1: off), the host MiB set aside for hibernated
    copies, and the seconds a pod must have been idle before it is hibernated for another."""

    factor: float = 1.0
    host_mib: int = 0
    min_idle: int = 300

    @property
    def on(self) -> bool:
        return self.factor > 1.0


def overcommit_problem(
    node: str, factor: float, host_gib: int, min_idle: int, usage_interval: float = 15.0
) -> str | None:
    """What is wrong with a node's overcommit options (in words naming the value and the fix), or None."""
    where = f"node {node}"
    if isinstance(factor, bool) or not math.isfinite(factor) or not 1.0 <= factor <= MAX_OVERCOMMIT:
        return (
            f"{where}: --overcommit {factor!r} is not from 1 to {MAX_OVERCOMMIT:g}; give 1 (off) or "
            "how many times its memory a card's slices may hold together, awake or hibernated, "
            "e.g. 2 (GPUShareDevicePlugin.overcommit, or 'overcommit' in --node-config)"
        )
    if host_gib < 0:
        return (
            f"{where}: --hibernation-host-memory-gib {host_gib} is negative; give the GiB of host "
            "memory set aside on this node for hibernated copies, e.g. 64"
        )
    if min_idle < 0:
        return (
            f"{where}: --hibernation-min-idle {min_idle} is negative; give the seconds a notebook must "
            "have done no GPU work before it is hibernated for another, e.g. 300"
        )
    if factor > 1.0 and host_gib <= 0:
        return (
            f"{where}: --overcommit {factor:g} needs --hibernation-host-memory-gib above 0 (got "
            f"{host_gib}): the GiB of host memory set aside on this node for hibernated copies, e.g. "
            "64 ('hibernationHostMemoryGiB' in --node-config); or --overcommit 1 to switch it off"
        )
    if factor > 1.0 and usage_interval <= 0:
        return (
            f"{where}: --overcommit {factor:g} needs the usage loop (--usage-interval above 0, got "
            f"{usage_interval:g}): the plugin measures each pod's GPU memory before it counts a "
            "notebook hibernated; or --overcommit 1 to switch it off"
        )
    return None


def held_units(units: int, factor: float) -> int:
    """The units a card's slices may hold together, awake or not: floor(factor x units)."""
    return math.floor(max(1.0, factor) * units + 1e-9)


def counted_hibernated(
    hibernated: Mapping[str, int], need: Mapping[str, int], host_mib: int
) -> dict[str, int]:
    """The hibernated MiB counted on each card: at most its own, never above ``host_mib`` in all.

    ``need``: per card, the MiB its held slices already take beyond its memory (which its declared
    size must go on covering, else the extender would stop counting a pod it placed); they come
    first, then the rest card by card in UUID order."""
    left = max(0, host_mib)
    out: dict[str, int] = {}
    for uuid in sorted(hibernated):
        take = min(max(0, hibernated[uuid]), max(0, need.get(uuid, 0)), left)
        out[uuid] = take
        left -= take
    for uuid in sorted(hibernated):
        more = min(max(0, hibernated[uuid]) - out[uuid], left)
        out[uuid] += more
        left -= more
    return out


def declared_mib(real: int, counted: int, factor: float, mib_per_unit: int) -> int:
    """A card's size as declared to the extender: ``min(real + counted, F x real)``, MiB."""
    cap = held_units(real // mib_per_unit, factor) * mib_per_unit
    return min(real + max(0, counted), cap)


@dataclass(frozen=True)
class Ask:
    """What a notebook server asks through its door (``ask.json``)."""

    hibernated: bool = False  # every GPU process of the server is hibernated
    wake: bool = False  # a kernel asks to wake
    idle_seconds: float = 0.0  # how long the server's least idle kernel has run nothing


def ask_json(ask: Ask) -> str:
    """``ask.json`` as the notebook writes it."""
    return json.dumps({"hibernated": ask.hibernated, "wake": ask.wake, "idle_seconds": ask.idle_seconds})


def _door_object(raw: bytes) -> dict[str, Any] | None:
    """A door file's JSON object (either side's), or None where it is too long or is not one."""
    if len(raw) > MAX_ASK_BYTES:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def read_ask(raw: bytes) -> Ask | None:
    """``ask.json``'s text, or None where it is too long, not JSON or not of the shape."""
    doc = _door_object(raw)
    if doc is None:
        return None
    hibernated, wake, idle = doc.get("hibernated"), doc.get("wake"), doc.get("idle_seconds", 0)
    if not isinstance(hibernated, bool) or not isinstance(wake, bool):
        return None
    if isinstance(idle, bool) or not isinstance(idle, int | float) or not math.isfinite(idle) or idle < 0:
        return None
    return Ask(hibernated, wake, float(min(idle, 10**9)))


@dataclass(frozen=True)
class Answer:
    """The plugin's answer to one notebook server (``answer.json``)."""

    state: str  # AWAKE or HIBERNATED: as the plugin records it
    grant: bool  # the slice is the server's to use on the card now
    place: int | None = None  # 1-based place in its card's line to wake
    ahead: int | None = None
    words: str = ""
    hibernate_now: bool = False  # a neighbour waits: hibernate now

    def to_json(self) -> str:
        return json.dumps(
            {
                "state": self.state,
                "grant": self.grant,
                "place": self.place,
                "ahead": self.ahead,
                "words": self.words,
                "hibernate_now": self.hibernate_now,
            },
            sort_keys=True,
        )


def read_answer(raw: bytes) -> Answer | None:
    """``answer.json`` as the notebook reads it, or None where it is not of the shape."""
    doc = _door_object(raw)
    if doc is None or doc.get("state") not in (AWAKE, HIBERNATED):
        return None
    place, ahead, words = doc.get("place"), doc.get("ahead"), doc.get("words", "")
    grant, now = doc.get("grant"), doc.get("hibernate_now", False)
    if not isinstance(grant, bool) or not isinstance(now, bool) or not isinstance(words, str):
        return None
    if any(v is not None and type(v) is not int for v in (place, ahead)):
        return None
    return Answer(doc["state"], grant, place, ahead, words[:500], now)


@dataclass(frozen=True)
class PodRecord:
    """A pod as the plugin records it. ``quiet_since``: since when the plugin has measured it
    doing no GPU work (or not measured it), by its own clock; None while it works."""

    state: str
    since: float
    card: str
    mib: int
    quiet_since: float | None = None


@dataclass(frozen=True)
class CardSums:
    real_mib: int
    awake_mib: int
    hibernated_mib: int


@dataclass(frozen=True)
class Book:
    """Every pod's record (by pod UID) and each card's line to wake (pod UIDs, first first)."""

    pods: Mapping[str, PodRecord] = field(default_factory=dict)
    line: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def hibernated_mib(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.pods.values():
            if r.state == HIBERNATED:
                out[r.card] = out.get(r.card, 0) + r.mib
        return out


def book_annotation(book: Book, oc: Overcommit, cards: Mapping[str, CardSums]) -> str:
    """The Node annotation ``gpushare-hub.io/hibernation``."""
    doc = {
        "factor": oc.factor,
        "hostMiB": oc.host_mib,
        "minIdleSeconds": oc.min_idle,
        "cards": {
            u: {"realMiB": c.real_mib, "awakeMiB": c.awake_mib, "hibernatedMiB": c.hibernated_mib}
            for u, c in sorted(cards.items())
        },
        "pods": {
            uid: {
                "state": r.state,
                "since": int(r.since),
                "card": r.card,
                "mib": r.mib,
                "quietSince": None if r.quiet_since is None else int(r.quiet_since),
            }
            for uid, r in sorted(book.pods.items())
        },
        "line": {u: list(q) for u, q in sorted(book.line.items()) if q},
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def _whole(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v < 2**53 else None


def _record(item: Any) -> PodRecord | None:
    if not isinstance(item, dict):
        return None
    state, card = item.get("state"), item.get("card")
    since, mib, quiet = _whole(item.get("since")), _whole(item.get("mib")), _whole(item.get("quietSince"))
    if state not in (AWAKE, HIBERNATED) or not isinstance(card, str) or since is None or mib is None:
        return None
    return PodRecord(state, float(since), card, mib, None if quiet is None else float(quiet))


def read_book(raw: str | None) -> Book:
    """The book an earlier run of the plugin published; what cannot be read is left out (an
    unreadable annotation reads as an empty book: every pod is then seen anew)."""
    if not raw or len(raw) > MAX_BOOK_CHARS:
        return Book()
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return Book()
    if not isinstance(doc, dict):
        return Book()
    pods: dict[str, PodRecord] = {}
    items = doc.get("pods")
    for uid, item in list(items.items() if isinstance(items, dict) else ())[:MAX_BOOK_PODS]:
        rec = _record(item)
        if isinstance(uid, str) and rec is not None:
            pods[uid] = rec
    line: dict[str, tuple[str, ...]] = {}
    lines = doc.get("line")
    for card, q in lines.items() if isinstance(lines, dict) else ():
        if isinstance(q, list):
            kept = [u for u in q if isinstance(u, str) and u in pods and pods[u].card == card]
            line[card] = tuple(dict.fromkeys(kept))
    return Book(pods, line)
