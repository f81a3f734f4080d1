"""Bind: choose the card, reserve it, post the Binding, and never free a card that may be taken.

A Binding has three outcomes, not two: the API server applied it (the pod is
bound with its card written on it, in one atomic update), refused it (a 4xx:
nothing changed), or its answer was lost (a timeout, a reset connection, an API
server that restarted or stalled: it may or may not have been applied). The
reservation in the ledger follows the outcome:

* applied: kept (assumed) until the informer sees the pod bound;
* refused: released at once;
* unknown: kept, and the pod is read back until the API server answers. Bound
  with our card: kept. Gone, replaced, or bound by someone else: released. Still
  unbound: released only once the API server has answered for ``settle``
  seconds, so that a Binding still queued inside it cannot land afterwards.

A bind for a pod whose bind is in flight, unknown or done (kube-scheduler retries
after a timed-out bind, or replays it) is answered from what the API server
holds and never releases the reservation. A pod copy from filter time is used
only when the ledger holds nothing for the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from gpushare_hub.core import GPUShareError, Placement, PodObject, ResourceNames
from gpushare_hub.core.annotations import AllocationRecord
from gpushare_hub.core.names import ALLOCATION_ANNOTATION

from .decisions import Decisions
from .kube import ApiError, Kube

log = logging.getLogger("gpushare.extender")


class Phase(enum.Enum):
    IN_FLIGHT = "in flight"
    UNKNOWN = "unknown"
    CONFIRMED = "confirmed"


@dataclass
class _Bind:
    node: str
    uid: str
    phase: Phase
    since: float
    record: AllocationRecord | None


class Outcome(enum.Enum):
    BOUND = "bound"
    NO_GPU = "bound, no card asked"
    ALREADY_BOUND = "already bound"
    IN_PROGRESS = "in progress"
    UNKNOWN = "unknown"
    FAILED = "failed"
    REFUSED = "refused"
    UNREADABLE = "pod unreadable"
    REPLACED = "replaced"


@dataclass(frozen=True)
class BindResult:
    """What a bind came to; :meth:`error` renders it for ExtenderBindingResult.Error."""

    outcome: Outcome
    pod: str
    node: str
    detail: str = ""
    placement: Placement | None = None
    pod_object: PodObject | None = None  # the pod as bound (BOUND only)

    @property
    def ok(self) -> bool:
        return self.outcome in (Outcome.BOUND, Outcome.NO_GPU)

    def error(self) -> str:
        o, pod, node, detail = self.outcome, self.pod, self.node, self.detail
        if self.ok:
            return ""
        if o is Outcome.ALREADY_BOUND:
            return f"pod {pod} is already bound to {node} (as the API server says); not binding it again"
        if o is Outcome.IN_PROGRESS:
            return f"pod {pod}: a bind to {node} is in progress; not binding it twice"
        if o is Outcome.UNKNOWN:
            return (
                f"binding pod {pod} to {node}: the API server's answer was lost ({detail}); its card "
                "stays reserved until the API server shows whether the pod is bound; retry shortly"
            )
        if o is Outcome.FAILED:
            return f"binding pod {pod} to {node} failed: {detail}"
        if o is Outcome.UNREADABLE:
            return f"pod {pod}: cannot read it before binding ({detail})"
        if o is Outcome.REPLACED:
            return f"pod {pod} was replaced ({detail}); not binding"
        return detail  # REFUSED: the placer's reason names pod, node and the way out


def _describe(err: BaseException) -> str:
    if isinstance(err, ApiError):
        return f"{err.status} {err.reason}"
    if isinstance(err, asyncio.TimeoutError | TimeoutError):
        return "no answer within the timeout"
    return f"{type(err).__name__}: {err}".rstrip(": ")


def _definite_refusal(err: BaseException) -> bool:
    """The API server answered and did not apply the Binding (4xx)."""
    return isinstance(err, ApiError) and err.status is not None and 400 <= int(err.status) < 500


class Binder:
    """Binds pods for kube-scheduler on one ledger (see the module docstring)."""

    def __init__(
        self,
        kube: Kube,
        decisions: Callable[[], Decisions],
        names: ResourceNames,
        settle: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self._decisions = decisions
        self.names = names
        self.settle = settle
        self._clock = clock
        self._binds: dict[str, _Bind] = {}
        self._resolvers: dict[str, asyncio.Task[None]] = {}
        # Pods as the scheduler sent them to filter, by UID, so that bind (which gets
        # names only) need not read them again. Bounded; a miss just reads the pod.
        self._recent: OrderedDict[str, PodObject] = OrderedDict()

    @property
    def decisions(self) -> Decisions:
        return self._decisions()

    def remember(self, pod: PodObject) -> None:
        uid = pod.uid
        if uid:
            self._recent[uid] = pod
            self._recent.move_to_end(uid)
            while len(self._recent) > 4096:
                self._recent.popitem(last=False)

    def unresolved(self, key: str, listed_at: float) -> bool:
        """The informer's ``protect``: a relist sent at ``listed_at`` that does not show the pod
        keeps its reservation while the bind is unsettled, or was confirmed after that list."""
        b = self._binds.get(key)
        return b is not None and (b.phase is not Phase.CONFIRMED or b.since >= listed_at)

    def phase(self, key: str) -> Phase | None:
        b = self._binds.get(key)
        return b.phase if b else None

    async def stop(self) -> None:
        for t in list(self._resolvers.values()):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # ---- the verb ----------------------------------------------------------------------
    async def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        key = f"{namespace}/{name}"
        ledger = self.decisions.ledger
        if key in self._binds:
            return await self._repeat(key, node)
        pod = self._recent.pop(uid, None) if uid else None
        if pod is None or pod.key != key or ledger.allocation(key) is not None:
            try:
                pod = await self.kube.get_pod(namespace, name)
            except Exception as err:
                return BindResult(Outcome.UNREADABLE, key, node, _describe(err))
        have = pod.uid
        if uid and have != uid:
            return BindResult(Outcome.REPLACED, key, node, f"uid {have}, scheduler asked for {uid}")
        if pod.node_name:
            return BindResult(Outcome.ALREADY_BOUND, key, pod.node_name)
        try:
            decision = self.decisions.bind(pod, node)
        except GPUShareError as err:
            return BindResult(Outcome.REFUSED, key, node, str(err))
        annotations: dict[str, str] = {}
        record = None
        if decision is not None:
            if not isinstance(decision, Placement):
                return BindResult(Outcome.REFUSED, key, node, decision.reason)
            record = decision.record()
            annotations = record.pod_annotations(self.decisions.card_units(decision), time.time_ns())
            self._binds[key] = _Bind(node, uid or have, Phase.IN_FLIGHT, self._clock(), record)
        try:
            await self.kube.bind(namespace, name, uid or have, node, annotations)
        except asyncio.CancelledError:
            if decision is not None:
                self._unknown(key)
            raise
        except Exception as err:
            if decision is None:
                return BindResult(Outcome.FAILED, key, node, _describe(err))
            if _definite_refusal(err):
                self._release(key)
                return BindResult(Outcome.FAILED, key, node, _describe(err))
            self._unknown(key)
            log.warning("bind of pod %s to %s: outcome unknown (%s); card kept", key, node, _describe(err))
            return BindResult(Outcome.UNKNOWN, key, node, _describe(err))
        if decision is None:
            return BindResult(Outcome.NO_GPU, key, node)
        b = self._binds.get(key)
        if b is not None:
            b.phase, b.since = Phase.CONFIRMED, self._clock()
        return BindResult(Outcome.BOUND, key, node, placement=decision, pod_object=pod)

    async def _repeat(self, key: str, node: str) -> BindResult:
        """A bind for a pod whose own bind is not settled: answer, never release."""
        b = self._binds[key]
        if b.phase is Phase.IN_FLIGHT:
            return BindResult(Outcome.IN_PROGRESS, key, b.node)
        if b.phase is Phase.CONFIRMED:
            return BindResult(Outcome.ALREADY_BOUND, key, b.node)
        namespace, _, name = key.partition("/")
        try:
            pod = await self.kube.get_pod(namespace, name)
        except Exception as err:
            return BindResult(Outcome.UNKNOWN, key, b.node, f"still: {_describe(err)}")
        self.observe(pod, from_read=True)
        if pod.node_name:
            return BindResult(Outcome.ALREADY_BOUND, key, pod.node_name)
        return BindResult(Outcome.UNKNOWN, key, b.node, "the pod is not bound yet")

    # ---- settling ----------------------------------------------------------------------
    def _release(self, key: str) -> None:
        b = self._binds.pop(key, None)
        ledger = self.decisions.ledger
        held = ledger.allocation(key)
        if b is not None and held is not None and held.assumed and (not held.uid or held.uid == b.uid):
            ledger.release(key)
        task = self._resolvers.pop(key, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _unknown(self, key: str) -> None:
        b = self._binds[key]
        b.phase = Phase.UNKNOWN
        if key not in self._resolvers:
            self._resolvers[key] = asyncio.get_running_loop().create_task(self._resolve(key))

    async def _resolve(self, key: str) -> None:
        """Read the pod back until its bind's outcome is known (see the module docstring)."""
        namespace, _, name = key.partition("/")
        answering_since: float | None = None
        attempt = 0
        try:
            while key in self._binds and self._binds[key].phase is Phase.UNKNOWN:
                try:
                    pod = await self.kube.get_pod(namespace, name)
                except ApiError as err:
                    if err.status == 404:
                        log.info("pod %s is gone; its unconfirmed reservation is released", key)
                        self._release(key)
                        return
                    answering_since = None
                except Exception:
                    answering_since = None
                else:
                    now = self._clock()
                    answering_since = answering_since or now
                    if self.observe(pod, from_read=True):
                        return
                    if now - answering_since >= self.settle:
                        log.info(
                            "pod %s is still unbound %.0fs after the API server answered again: its "
                            "bind did not land; the card is released",
                            key,
                            now - answering_since,
                        )
                        self._release(key)
                        return
                await asyncio.sleep(min(2.0, 0.25 * 2**attempt))
                attempt += 1
        finally:
            if self._resolvers.get(key) is asyncio.current_task():
                del self._resolvers[key]

    def observe(self, pod: PodObject, from_read: bool = False) -> bool:
        """A pod as the API server holds it (a watch event or a read): settle its bind if
        that decides it. True when settled."""
        key = pod.key
        b = self._binds.get(key)
        if b is None:
            return True
        uid = pod.uid
        if b.uid and uid and uid != b.uid:
            self._release(key)  # another pod of that name: ours is gone
            return True
        bound_to = pod.node_name
        if not bound_to:
            return False
        raw = pod.annotations.get(ALLOCATION_ANNOTATION)
        ours = False
        if raw and b.record is not None:
            with contextlib.suppress(GPUShareError):
                got = AllocationRecord.from_json(raw, where=f"pod {key}")
                ours = bound_to == b.node and got.cards == b.record.cards
        if ours:
            if from_read:
                b.phase, b.since = (
                    Phase.CONFIRMED,
                    self._clock(),
                )  # the watch will show it and turn it into a plain hold
            else:
                del self._binds[key]
        else:
            self._release(key)  # bound without our card: our Binding did not land
        return True

    def on_pod(self, etype: str, pod: PodObject) -> None:
        """Informer subscription: watch events settle binds too."""
        key = pod.key
        b = self._binds.get(key)
        if b is None:
            return
        if etype == "DELETED":
            uid = pod.uid
            if not uid or not b.uid or uid == b.uid:
                self._release(key)
            return
        self.observe(pod)
