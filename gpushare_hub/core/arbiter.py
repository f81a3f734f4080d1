"""Who is awake on an overcommitted card, who waits to wake, and who hibernates for them (pure).

The device plugin applies :func:`decide` every second or so to its book (:mod:`.overcommit`),
what each notebook asks through its door, and what it measures of each pod. The rules:

* a pod without a door, or over several cards, is always awake;
* a pod seen for the first time is awake where its slice fits beside the card's awake slices,
  else hibernated (it landed while a wake took the room: it must ask to wake before it works);
* awake -> hibernated: its ask says hibernated (and not wake) *and* a measurement taken since
  its last change finds it holding no more than the idle memory: a forged ask is caught here;
* a hibernated pod asking to wake joins its card's line (first asked, first served). The head is
  granted, and recorded awake at once, when the card's awake slices plus its own fit the card;
  otherwise the awake pods of that card idle the longest past the minimum (by their own ask and
  by the plugin's clock: no GPU work measured for that long) are asked to hibernate now, as many
  as make room, or none;
* a pod recorded hibernated that a measurement since its change finds using memory woke without a
  grant: recorded awake where it fits (a grant after the fact), else kept hibernated and reported
  over its slice with 0 allowed (:attr:`Decision.over`), so that the over-slice action follows;
* a pod gone is forgotten.

Invariant (tests/unit/test_overcommit_arbiter.py): whatever the asks and measurements, the pods
recorded awake on a card never sum above its memory; a pod using memory without a grant that
does not fit is never counted awake, but reported over its slice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from .overcommit import AWAKE, HIBERNATED, Answer, Ask, Book, CardSums, PodRecord


@dataclass(frozen=True)
class Measured:
    """The plugin's latest reading of a pod on its card, and when it was taken (Unix seconds)."""

    used_mib: int
    sm_util: int | None
    at: float


@dataclass(frozen=True)
class Slice:
    key: str  # namespace/name
    cards: Mapping[str, int]  # card UUID -> MiB
    door: bool = True  # Allocate gave it a door: it can ask (else it never hibernates)


@dataclass(frozen=True)
class Situation:
    """What the plugin knows now. ``real``: each card's memory as sold (MiB); ``slices``: the
    pods holding cards on the node (by UID); ``asks`` and ``measured``: by pod UID."""

    real: Mapping[str, int]
    slices: Mapping[str, Slice]
    asks: Mapping[str, Ask] = field(default_factory=dict)
    measured: Mapping[str, Measured] = field(default_factory=dict)
    now: float = 0.0
    idle_memory_mib: int = 1024
    min_idle: int = 300


@dataclass(frozen=True)
class Unasked:
    """A pod found using memory while recorded hibernated: woke without a grant."""

    uid: str
    key: str
    card: str
    mib: int
    used_mib: int
    fits: bool  # recorded awake after the fact; else kept hibernated and over its slice

    def message(self, node: str) -> str:
        head = (
            f"pod {self.key} uses {self.used_mib} MiB on card {self.card} (node {node}) while recorded "
            "hibernated: it woke without the device plugin's grant"
        )
        if self.fits:
            return (
                f"{head}; the card had room, so it is now counted awake. Wake through the notebook extension"
            )
        return (
            f"{head}, and the card's awake slices leave no room for its {self.mib} MiB: it is reported "
            "over its slice (0 allowed) until it hibernates again. Wake through the notebook extension, "
            "which waits for a grant"
        )


@dataclass(frozen=True)
class Decision:
    book: Book
    answers: Mapping[str, Answer]
    unasked: tuple[Unasked, ...] = ()
    over: frozenset[str] = frozenset()  # pod UIDs reported over their slice with 0 allowed

    def card_sums(self, real: Mapping[str, int], slices: Mapping[str, Slice]) -> dict[str, CardSums]:
        awake = _fixed(slices, real)
        hib: dict[str, int] = {}
        for r in self.book.pods.values():
            into = awake if r.state == AWAKE else hib
            into[r.card] = into.get(r.card, 0) + r.mib
        return {u: CardSums(m, awake.get(u, 0), hib.get(u, 0)) for u, m in real.items()}


def _hibernates(sl: Slice, real: Mapping[str, int]) -> bool:
    """Slices over several cards, on no card of ours, or of pods without a door (served before
    the node was overcommitted, whole cards) never hibernate: always awake."""
    return sl.door and len(sl.cards) == 1 and next(iter(sl.cards)) in real


def _fixed(slices: Mapping[str, Slice], real: Mapping[str, int]) -> dict[str, int]:
    """The MiB of pods that never hibernate, per card."""
    out: dict[str, int] = {}
    for sl in slices.values():
        if not _hibernates(sl, real):
            for u, mib in sl.cards.items():
                out[u] = out.get(u, 0) + mib
    return out


def duration(seconds: int) -> str:
    return f"{seconds // 60} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds} s"


class _Tick:
    """One application of the rules (the state of :func:`decide` while it runs)."""

    def __init__(self, book: Book, s: Situation) -> None:
        self.s = s
        self.fixed = _fixed(s.slices, s.real)
        self.pods: dict[str, PodRecord] = {}
        self.unasked: list[Unasked] = []
        self.over: set[str] = set()
        singles = {u: sl for u, sl in s.slices.items() if _hibernates(sl, s.real)}
        for uid, rec in book.pods.items():
            if uid in singles:
                ((card, mib),) = singles[uid].cards.items()
                self.pods[uid] = replace(rec, card=card, mib=mib)
        for uid in sorted(singles, key=lambda u: (singles[u].key, u)):
            if uid not in self.pods:
                ((card, mib),) = singles[uid].cards.items()
                state = AWAKE if self.fits(card, mib) else HIBERNATED
                self.pods[uid] = PodRecord(state, s.now, card, mib)
        self.line = {
            c: [u for u in q if u in self.pods and self.pods[u].card == c] for c, q in book.line.items()
        }

    def awake(self, card: str) -> int:
        mine = sum(r.mib for r in self.pods.values() if r.card == card and r.state == AWAKE)
        return self.fixed.get(card, 0) + mine

    def fits(self, card: str, mib: int) -> bool:
        return self.awake(card) + mib <= self.s.real.get(card, 0)

    def set(self, uid: str, state: str) -> None:
        self.pods[uid] = replace(self.pods[uid], state=state, since=self.s.now)

    def fresh(self, uid: str) -> Measured | None:
        """The pod's measurement if taken after its last change of state."""
        m = self.s.measured.get(uid)
        return m if m is not None and m.at > self.pods[uid].since else None

    def clocks(self) -> None:
        now = self.s.now
        for uid, r in self.pods.items():
            m = self.s.measured.get(uid)
            quiet = m is None or not m.sm_util
            since = min(r.quiet_since if r.quiet_since is not None else now, now) if quiet else None
            self.pods[uid] = replace(r, quiet_since=since)

    def hibernations(self) -> None:
        for uid in sorted(self.pods):
            ask, m = self.s.asks.get(uid), self.fresh(uid)
            quiet = m is not None and m.used_mib <= self.s.idle_memory_mib
            if self.pods[uid].state == AWAKE and ask and ask.hibernated and not ask.wake and quiet:
                self.set(uid, HIBERNATED)

    def unasked_wakes(self) -> None:
        for uid in sorted(self.pods, key=lambda u: (self.pods[u].since, u)):
            r, m = self.pods[uid], self.fresh(uid)
            if r.state != HIBERNATED or m is None or m.used_mib <= self.s.idle_memory_mib:
                continue
            fits = self.fits(r.card, r.mib)
            self.unasked.append(Unasked(uid, self.s.slices[uid].key, r.card, r.mib, m.used_mib, fits))
            if fits:
                self.set(uid, AWAKE)
            else:
                self.over.add(uid)

    def asking(self, uid: str) -> bool:
        ask = self.s.asks.get(uid)
        return self.pods[uid].state == HIBERNATED and ask is not None and ask.wake

    def lines(self) -> None:
        for q in self.line.values():
            q[:] = [u for u in dict.fromkeys(q) if self.asking(u)]
        for uid in sorted(self.pods):
            r = self.pods[uid]
            if self.asking(uid) and uid not in self.line.get(r.card, ()):
                self.line.setdefault(r.card, []).append(uid)
        for c, q in self.line.items():
            while q and self.fits(c, self.pods[q[0]].mib):
                self.set(q.pop(0), AWAKE)

    def qualifies(self, uid: str) -> bool:
        r, ask, s = self.pods[uid], self.s.asks.get(uid), self.s
        return (
            r.state == AWAKE
            and ask is not None
            and not ask.wake
            and ask.idle_seconds >= s.min_idle
            and r.quiet_since is not None
            and s.now - r.quiet_since >= s.min_idle
        )

    def victims(self, card: str) -> list[str]:
        """The fewest longest-idle qualifying pods whose hibernation lets the head wake, or none."""
        q = self.line.get(card)
        if not q:
            return []
        short = self.awake(card) + self.pods[q[0]].mib - self.s.real.get(card, 0)
        ready = [u for u, r in self.pods.items() if r.card == card and self.qualifies(u)]
        ready.sort(key=lambda u: (-self.s.asks[u].idle_seconds, u))
        chosen, freed = [], 0
        for u in ready:
            if freed >= short:
                break
            chosen.append(u)
            freed += self.pods[u].mib
        return chosen if freed >= short else []

    def answers(self) -> dict[str, Answer]:
        out: dict[str, Answer] = {}
        victims = {c: self.victims(c) for c in self.line}
        hibernate_now = {u for vs in victims.values() for u in vs}
        wait = duration(self.s.min_idle)
        for uid, r in self.pods.items():
            q = self.line.get(r.card, [])
            if uid in q:
                ahead = q.index(uid)
                tail = (
                    f"neighbours idle {wait} are hibernated first"
                    if victims.get(r.card)
                    else f"no neighbour has been idle {wait} yet"
                )
                words = f"waiting for {r.mib / 1024:g} GiB on your card: {ahead} ahead; {tail}"
                out[uid] = Answer(HIBERNATED, False, ahead + 1, ahead, words)
            elif uid in self.over:
                out[uid] = Answer(
                    HIBERNATED, False, None, None, "using the GPU without a grant: over its slice"
                )
            elif r.state == HIBERNATED:
                out[uid] = Answer(HIBERNATED, False, None, None, "hibernated; running a cell wakes it")
            elif uid in hibernate_now:
                words = "a neighbour waits for memory on your card: hibernate now"
                out[uid] = Answer(AWAKE, True, None, None, words, hibernate_now=True)
            else:
                out[uid] = Answer(AWAKE, True, None, None, "awake")
        return out


def decide(book: Book, s: Situation) -> Decision:
    """The book after one round of the rules, each pod's answer, and who woke unasked."""
    t = _Tick(book, s)
    t.clocks()
    t.hibernations()
    t.unasked_wakes()
    t.lines()
    answers = t.answers()
    line = {c: tuple(q) for c, q in sorted(t.line.items()) if q}
    return Decision(Book(dict(sorted(t.pods.items())), line), answers, tuple(t.unasked), frozenset(t.over))
