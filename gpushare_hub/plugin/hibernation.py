"""The hibernation keeper of an overcommitted node: the arbiter's rules applied every second.

Beside the usage loop, on a node whose plugin runs with ``--overcommit`` above 1: read each pod's
ask at its door, the usage loop's latest measurement of each pod, apply
:func:`gpushare_hub.core.arbiter.decide`, write each pod's answer, and publish on the Node the book
(``gpushare-hub.io/hibernation``) and the cards as declared to the extender
(``gpushare-hub.io/cards``: each card's memory plus the hibernated slices counted on it, at most
factor x), in one patch, when either changed. A pod that used the GPU without a grant gets one
Warning event (``GPUShareWokeWithoutGrant``); one that does not fit is reported over its slice with
0 allowed in the usage annotation. Doors of pods gone are removed. A restarted plugin reads its
book back from the Node, so no state is lost. Nothing a container writes raises out of the loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from gpushare_hub.core.arbiter import Decision, Measured, Situation, Slice, decide
from gpushare_hub.core.cards import cards_to_annotation
from gpushare_hub.core.names import CARDS_ANNOTATION, HIBERNATION_ANNOTATION, WOKE_UNASKED_REASON
from gpushare_hub.core.overcommit import (
    Answer,
    Ask,
    Book,
    book_annotation,
    counted_hibernated,
    declared_mib,
    read_book,
)

from .state import PluginState
from .usage import UsageReporter, UsageSink

log = logging.getLogger("gpushare.plugin")
TICK_SECONDS = 1.0
# While something waits on a measurement (a line, a pod asking to hibernate, a changed ask), the
# usage loop is asked to read again at most this often.
POKE_SECONDS = 2.0


class HibernationKeeper:
    def __init__(
        self,
        state: PluginState,
        reporter: UsageReporter,
        sink: UsageSink,
        clock: Callable[[], float] = time.time,
    ) -> None:
        assert state.doors is not None, "the keeper serves overcommitted nodes (state.doors set)"
        self.state = state
        self.doors = state.doors
        self.reporter = reporter
        self.sink = sink
        self.clock = clock
        self.oc = state.settings.overcommit
        self.book: Book | None = None
        self.over: frozenset[tuple[str, str]] = frozenset()
        self._asks: dict[str, Ask] = {}  # the last readable ask of each pod
        self._answered: dict[str, tuple[Answer, Ask | None]] = {}  # and the ask it answered
        self._published: str | None = None
        self._warned: set[tuple[str, bool]] = set()  # (pod UID, fitted)
        self._poked = 0.0
        self._seen_asks: dict[str, Ask] = {}  # the asks of the tick before
        self._short: set[str] = set()  # cards whose held slices exceed what is declared (warned)
        reporter.zero_slices = lambda: self.over

    def real(self) -> dict[str, int]:
        mib = self.state.settings.names.mib_per_unit
        return {c.uuid: c.units * mib for c in self.state.cards}

    def restore(self) -> Book:
        node = self.state.settings.node
        try:
            raw = self.sink.node_annotation(node, HIBERNATION_ANNOTATION)
        except Exception as err:
            log.warning(
                "cannot read the hibernation book node %s published before (%s); starting anew", node, err
            )
            raw = None
        book = read_book(raw)
        log.info(
            "overcommit %g on node %s: %d pod(s) restored, %d hibernated",
            self.oc.factor,
            node,
            len(book.pods),
            sum(1 for r in book.pods.values() if r.state != "awake"),
        )
        return book

    def situation(self) -> Situation | None:
        reading = self.reporter.reading
        if reading is None:
            return None
        report, at = reading
        real = self.real()
        cards: dict[str, dict[str, int]] = {}
        keys: dict[str, str] = {}
        for p in report.pods:
            keys[p.uid] = p.pod
            if p.slice_mib > 0:
                cards.setdefault(p.uid, {})[p.card] = p.slice_mib
        doors = self.doors.opened()
        slices = {uid: Slice(keys[uid], c, door=uid in doors) for uid, c in cards.items()}
        measured = {}
        for p in report.pods:
            sl = slices.get(p.uid)
            if sl is not None and list(sl.cards) == [p.card]:
                measured[p.uid] = Measured(p.used_mib, p.sm_util, at)
        for uid in slices:
            ask = self.doors.ask(uid)
            if ask is not None:
                self._asks[uid] = ask
            elif not self.doors.asks(uid):  # taken back; one that cannot be read leaves the last
                self._asks.pop(uid, None)
        self._asks = {u: a for u, a in self._asks.items() if u in slices}
        return Situation(
            real,
            slices,
            dict(self._asks),
            measured,
            self.clock(),
            self.reporter.idle_memory_mib,
            self.oc.min_idle,
        )

    def tick(self) -> Decision | None:
        if self.book is None:
            self.book = self.restore()
        s = self.situation()
        if s is None:  # no reading yet: declare the cards as the book left them
            if not self.state.declared:
                self.state.declared = self.declared(self.book, self.real(), self._book_slices(self.book))
            self.reporter.poke()
            return None
        asks_changed = s.asks != self._seen_asks
        self._seen_asks = dict(s.asks)
        d = decide(self.book, s)
        self.book = d.book
        self.over = frozenset((uid, r.card) for uid, r in d.book.pods.items() if uid in d.over)
        for uid, answer in d.answers.items():
            # Written again after each new ask, so that an answer not older than the ask answers it.
            said = (answer, s.asks.get(uid))
            if self._answered.get(uid) != said and self.doors.answer(uid, answer):
                self._answered[uid] = said
        self._answered = {u: a for u, a in self._answered.items() if u in d.answers}
        self._warn(d)
        self._publish(d, s)
        unseen = self._close_gone(s)
        pending = (
            unseen
            or bool(d.book.line)
            or any(
                a.hibernate_now or (a.state == "awake" and s.asks.get(u, Ask()).hibernated)
                for u, a in d.answers.items()
            )
        )
        if (pending or asks_changed) and s.now - self._poked >= POKE_SECONDS:
            self._poked = s.now
            self.reporter.poke()
        return d

    def _warn(self, d: Decision) -> None:
        node = self.state.settings.node
        for u in d.unasked:
            message = u.message(node)
            if (u.uid, u.fits) in self._warned:
                continue
            self._warned.add((u.uid, u.fits))
            log.warning(message)
            namespace, _, name = u.key.partition("/")
            try:
                self.sink.warn_pod(namespace, name, u.uid, u.card, WOKE_UNASKED_REASON, message)
            except Exception as err:
                log.warning("could not post the Warning event on pod %s: %s", u.key, err)
        self._warned = {w for w in self._warned if w[0] in d.book.pods}

    @staticmethod
    def _book_slices(book: Book) -> dict[str, Slice]:
        return {uid: Slice(uid, {r.card: r.mib}) for uid, r in book.pods.items()}

    def declared(
        self, book: Book, real_mib: Mapping[str, int], slices: Mapping[str, Slice]
    ) -> dict[str, int]:
        """Each card's units as declared to the extender."""
        mib = self.state.settings.names.mib_per_unit
        held: dict[str, int] = {}
        for sl in slices.values():
            for card, m in sl.cards.items():
                held[card] = held.get(card, 0) + m
        need = {u: max(0, held.get(u, 0) - real) for u, real in real_mib.items()}
        counted = counted_hibernated(book.hibernated_mib(), need, self.oc.host_mib)
        short = {u for u, n in need.items() if n > counted.get(u, 0)}
        for u in sorted(short - self._short):
            log.warning(
                "card %s holds %d MiB beyond its memory, more than the hibernated copies counted on it "
                "(%d MiB; --hibernation-host-memory-gib %d): raise that, or the extender stops counting pods",
                u,
                need[u],
                counted.get(u, 0),
                self.oc.host_mib // 1024,
            )
        self._short = short
        return {
            u: declared_mib(real, counted.get(u, 0), self.oc.factor, mib) // mib
            for u, real in real_mib.items()
        }

    def _publish(self, d: Decision, s: Situation) -> None:
        self.state.declared = self.declared(d.book, s.real, s.slices)
        book = book_annotation(d.book, self.oc, d.card_sums(s.real, s.slices))
        cards = cards_to_annotation(self.state.published_cards())
        text = book + cards
        if text == self._published:
            return
        try:
            self.sink.annotate_node(
                self.state.settings.node, {HIBERNATION_ANNOTATION: book, CARDS_ANNOTATION: cards}
            )
        except Exception as err:
            log.warning(
                "could not publish the hibernation book on node %s: %s", self.state.settings.node, err
            )
            return
        self._published = text

    def _close_gone(self, s: Situation) -> bool:
        """Remove the doors of pods the latest reading no longer lists, made before it began;
        True where a door was made after it (a new pod: worth reading again)."""
        reading = self.reporter.reading
        taken = reading[1] if reading else 0.0
        unseen = False
        for uid, made in self.doors.opened().items():
            if uid in s.slices:
                continue
            if made < taken:
                self.doors.close(uid)
                log.info("hibernation door of pod %s removed: the pod is gone", uid)
            else:
                unseen = True
        return unseen

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception as err:  # the keeper must never stop the plugin
                log.warning("hibernation keeper: %s; going on", err)
            stop.wait(TICK_SECONDS)


def start_keeper(state: PluginState, reporter: UsageReporter, sink: UsageSink, stop: threading.Event) -> None:
    """One reading and one round now (so that the Node declares its cards before the kubelet
    registers the plugin), then the keeper's thread until ``stop``."""
    keeper = HibernationKeeper(state, reporter, sink)
    try:
        reporter.poll()
        keeper.tick()
    except Exception as err:
        log.warning("hibernation keeper: first round failed (%s); retrying every second", err)
    threading.Thread(target=keeper.run, args=(stop,), name="hibernation", daemon=True).start()
