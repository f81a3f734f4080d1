"""The over-slice rule: a server whose processes stay over its slice gets the admin's action.

The device plugin measures what each pod's processes hold on its card, whatever tier holds the
slice: a kernel that lifted its own cap, a CUDA program no framework caps, several processes
where MPS caps each one. A pod over its slice is flagged on the dashboard and in ``api/v1/me``
at once (``over_slice``); once it has stayed over for ``over_slice_after`` seconds, the
:class:`~gpushare_hub.service.enforcer.Enforcer` applies ``over_slice_action``:

- ``notify``: a Warning event (``GPUShareOverSliceNotified``) and a log line; the status bar shows
  the words;
- ``stop``: first the warning (``GPUShareOverSliceWarning``, the status bar counts down
  ``over_slice_warn_before`` seconds), then the hub stops the server (``GPUShareOverSliceStopped``)
  unless it went back under its slice meanwhile.

Going back under the slice ends the stretch. The clock is this service's own (the plugin
publishes no "over since"): a restarted service starts it again, so it may warn again later,
never sooner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare_hub.core.durations import duration_words
from gpushare_hub.core.names import (
    OVER_SLICE_NOTIFIED_REASON,
    OVER_SLICE_STOPPED_REASON,
    OVER_SLICE_WARNING_REASON,
)

from .enforcer import DUE, WARN, Case, Reasons
from .held import HeldSlice

NONE, NOTIFY, STOP = "none", "notify", "stop"
ACTIONS = (NONE, NOTIFY, STOP)
PodKey = tuple[str, str]  # (namespace, pod)


@dataclass(frozen=True)
class OverSliceRule:
    action: str = NONE
    after: int = 300  # seconds over the slice before the action (or its warning)
    warn_before: int = 300  # with STOP: seconds between the warning and the stop

    @property
    def configured(self) -> bool:
        return self.action != NONE


@dataclass(frozen=True)
class OverState:
    """One pod over its slice, and where its stretch stands."""

    slice: HeldSlice
    since: float  # when this service first saw it over (Unix seconds)
    action: str
    phase: str  # "over" (counting), WARN, or DUE
    due_at: float  # when the action is taken

    def words(self, now: float) -> str:
        s = self.slice
        used = f"{(s.used_mib or 0) / 1024:.1f} GiB"
        where = f"your server{' ' + repr(s.server) if s.server else ''}"
        head = (
            f"{where} holds {used} of GPU memory, more than its {s.units} GiB slice, for "
            f"{duration_words(int(now - self.since))}: its card's other users may run out of memory"
        )
        fix = "free memory (shut down a kernel you no longer need) or start it again with a larger slice"
        if self.action == STOP:
            left = max(0, int(self.due_at - now))
            when = f"in {duration_words(left)}" if left else "now"
            return f"{head}. It will be stopped {when} unless it goes back under its slice: {fix}."
        return f"{head}. Please {fix}."

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "action": self.action,
            "phase": self.phase,
            "over_seconds": int(now - self.since),
            "seconds_left": max(0, int(self.due_at - now)),
            "words": self.words(now),
        }


class OverSlicePolicy:
    """Pods that stay over their slices (module docstring)."""

    reasons = Reasons(OVER_SLICE_WARNING_REASON, OVER_SLICE_NOTIFIED_REASON, OVER_SLICE_STOPPED_REASON)
    setting = "over_slice_action"
    park_profile = ""
    warning_logged = True

    def __init__(self, rule: OverSliceRule) -> None:
        self.rule = rule
        self._since: dict[PodKey, float] = {}
        self._done: dict[tuple[PodKey, float], set[str]] = {}

    def states(self, held: Sequence[HeldSlice], now: float, observe: bool = False) -> list[OverState]:
        """The pods of ``held`` over their slices now; ``observe``: this is the pass's fresh
        reading, which starts and ends stretches (a reader of ``api/v1/me`` only looks)."""
        over = {(s.namespace, s.pod): s for s in held if s.over_slice and s.user}
        if observe:
            for key in [k for k in self._since if k not in over]:
                self._done = {d: w for d, w in self._done.items() if d[0] != key}
                del self._since[key]
        out = []
        for key, s in over.items():
            since = self._since.setdefault(key, now) if observe else self._since.get(key, now)
            due_at = since + self.rule.after + (self.rule.warn_before if self.rule.action == STOP else 0)
            if now >= due_at:
                phase = DUE
            elif self.rule.action == STOP and now >= since + self.rule.after:
                phase = WARN
            else:
                phase = "over"
            out.append(OverState(s, since, self.rule.action, phase, due_at))
        return out

    def cases(self, held: Sequence[HeldSlice], groups: Mapping[str, list[str]], now: float) -> list[Case]:
        if not self.rule.configured:
            return []
        out = []
        for st in self.states(held, now, observe=True):
            if st.phase not in (WARN, DUE):
                continue
            s = st.slice
            key = (s.namespace, s.pod)
            out.append(
                Case(
                    user=s.user,
                    servers=(s.server,),
                    pods=(key,),
                    phase=st.phase,
                    action=st.action,
                    words=st.words(now),
                    numbers=(
                        f"GPU slice of {s.user}{'/' + s.server if s.server else ''} over its slice (pod "
                        f"{s.namespace}/{s.pod}, {s.units} GiB slice, {s.used_mib} MiB held) for "
                        f"{int(now - st.since)} s; rule: {st.action} after {self.rule.after} s"
                    ),
                    done=frozenset(self._done.get((key, st.since), ())),
                    subject=(key, st.since),
                )
            )
        return out

    def record(self, case: Case, what: str, now: float, stopped: bool = True) -> None:
        """Remembered per stretch (in memory: see the module docstring); a stop the hub refused
        is not, so the next pass tries again."""
        if stopped:
            self._done.setdefault(case.subject, set()).add(what)
