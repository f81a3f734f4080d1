"""Idle return's policy: which slices idle on the GPU are warned about, and which are due.

Every pass (``gpu_idle_check_seconds``, on fresh figures only) the service hands the ledger
document and the hub users' groups to the :class:`~gpushare_hub.service.enforcer.Enforcer`,
which asks :meth:`IdlePolicy.cases` what applies. For each slice idle on the GPU,
:func:`~gpushare_hub.service.idle.idle_states` says the action and the phase; here they become
cases, once per idle stretch (the book remembers across restarts what was done):

- the warning phase (``stop`` and ``park`` only): a Warning event (``GPUShareIdleWarning``);
  ``api/v1/me`` and the notebook's status bar show the words and the Keep button;
- the deadline: ``notify`` tells (``GPUShareIdle``), ``stop`` stops the server and ``park``
  restarts it on the CPU-only profile (``GPUShareIdleReturned``), telling the spawner what was
  returned (``gpushare_returned``) for the spawn page's note.

A ``hibernate`` slice is no case at all: the notebook server's extension hibernates its idle
kernels and the server keeps running, so there is nothing to warn about, tell or do here.
A slice that did any work since the last reading has no idle clock at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpushare_hub.accounting.book import Book
from gpushare_hub.accounting.records import IdleAction
from gpushare_hub.core.durations import duration_words
from gpushare_hub.core.names import IDLE_NOTIFIED_REASON, IDLE_RETURNED_REASON, IDLE_WARNING_REASON

from .enforcer import DUE, NOTIFIED, RETURNED, WARN, WARNED, Case, Reasons
from .held import HeldSlice
from .idle import DUE as IDLE_DUE
from .idle import HIBERNATE, NOTIFY, PARK, WARNING, IdleRule, IdleState, idle_states

# The book's words for what was done about a stretch, and the enforcer's.
DONE = {"warned": WARNED, "notified": NOTIFIED, "stopped": RETURNED, "parked": RETURNED}


class IdlePolicy:
    """Idle slices' phases (module docstring), from the rule and the book's Keep presses."""

    reasons = Reasons(IDLE_WARNING_REASON, IDLE_NOTIFIED_REASON, IDLE_RETURNED_REASON)
    setting = "an idle action"
    warning_logged = False  # the event and the status bar say it; the log says what was done

    def __init__(self, rule: IdleRule, book: Book) -> None:
        self.rule = rule
        self.book = book
        self.park_profile = rule.park_profile

    def states(
        self, held: Sequence[HeldSlice], groups: Mapping[str, list[str]], now: float
    ) -> list[IdleState]:
        """The idle states of ``held`` (reading the Keep presses of their users only)."""
        keeps = self.book.keeps(s.user for s in held if s.user)
        return idle_states(held, groups, self.rule, keeps, int(now))

    def cases(self, held: Sequence[HeldSlice], groups: Mapping[str, list[str]], now: float) -> list[Case]:
        out = []
        for s in self.states(held, groups, now):
            if s.action == HIBERNATE:  # the notebook's to do (module docstring)
                continue
            if s.phase == WARNING and s.action != NOTIFY:
                phase = WARN
            elif s.phase == IDLE_DUE:
                phase = DUE
            else:
                continue
            done = frozenset(DONE[w] for w in self.book.idle_done(s.user, s.server, s.stretch) if w in DONE)
            returned = {"slice": s.slice, "units": s.units, "idle_seconds": s.idle_seconds}
            out.append(
                Case(
                    user=s.user,
                    servers=(s.server,),
                    pods=((s.namespace, s.pod),),
                    phase=phase,
                    action=s.action,
                    words=s.words(int(now)),
                    numbers=self._numbers(s),
                    done=done,
                    park_options={"gpushare_returned": returned},
                    subject=s,
                )
            )
        return out

    def _numbers(self, s: IdleState) -> str:
        kept = f", Keep pressed (postponed to {s.kept_until})" if s.kept_until is not None else ""
        return (
            f"idle GPU slice of {s.user}{'/' + s.server if s.server else ''} (pod {s.namespace}/{s.pod}, "
            f"{s.units} GiB, slice {s.slice or 'none'}): no GPU work and no more than an idle context "
            f"held for {s.idle_seconds} s ({duration_words(s.idle_seconds)}); rule: {s.action} after "
            f"{self.rule.return_after} s{kept}"
        )

    def record(self, case: Case, what: str, now: float, stopped: bool = True) -> None:
        """Recorded per stretch; a server the hub did not stop is not (the next pass tries again)."""
        s: IdleState = case.subject
        if what == RETURNED:
            if not stopped:
                return
            what, detail = ("parked", self.park_profile) if s.action == PARK else ("stopped", "")
        else:
            detail = ""
        self.book.record_idle(
            IdleAction(s.user, s.server, s.stretch, what, s.slice, s.units, int(now), s.idle_seconds, detail)
        )
