"""The ledger's book of ResourceClaims: which claim holds units under which key. Pure.

:meth:`~.ledger.Ledger.observe_claim` hands each claim event here; the units themselves are
counted by the ledger exactly as an annotation's (the rule of :mod:`.records`), through what the
ledger hands the book (:class:`Counting`: the book does not know the ledger), so ``snapshot()``,
availability, the dashboard, quotas, budgets, history and idle return see a claim's allocation
like any other.

The book is keyed by claim: each claim keeps its own reading (its node and shares), and the
ledger counts, under its pod's key, the sum of every claim reserved for that pod, as Prepare
and the scheduler do. Rules beyond :mod:`.claims`:

* Every claim of a pod counts. A claim that does not fit beside the pod's others (its card is
  full, or it names another node than they do) is refused alone, naming it; one refused for a
  full card counts once units on its node come back.
* A pod that holds our claim *and* carries an annotation record counts the claims:
  kube-scheduler writes them through the status subresource and the kubelet prepares exactly
  that, while a node serves one path only, so the annotation is set aside (kept, and counted
  again once the claims let go).
* A claim reserved for several pods counts once, for the first, and is reported
  (:func:`.claims.shared`) beside the ignored records: each of its pods gets the whole slice.
* A claim that was reserved for a pod and is no longer (the pod went) releases its units even
  while still allocated; one allocated and never yet reserved holds them under its own key.
* A claim on a node the ledger does not know waits, and is read again when the node comes.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, replace

from .cards import Node
from .claims import ClaimIgnored, ClaimObject, claim_node, claim_reading, ignored_claim, shared
from .objects import PodObject
from .placement import NodeState
from .records import Allocation, Ignored, IgnoredRecord, check_on_node, read_allocation
from .resources import ResourceNames


@dataclass(frozen=True)
class Counting:
    """The ledger's units as the book reads and changes them, handed over by the ledger
    (:class:`~.ledger.Ledger`) as plain values: its own maps and methods, shared, not copied."""

    names: ResourceNames
    node: Callable[[str], Node | None]  # a known node's cards
    state: Callable[[str], NodeState | None]  # a known node's state
    allocation: Callable[[str], Allocation | None]  # what a key holds, counted or waiting
    blocked: MutableMapping[str, Allocation]  # records refused only for a full card
    ignored: MutableMapping[str, IgnoredRecord]  # records that do not count, and why
    drop: Callable[[str], Allocation | None]  # a key's units back, no retry of refused records
    add: Callable[[Allocation], IgnoredRecord | None]  # count it if it fits, else say why not
    release: Callable[[str], Allocation | None]  # a key's units back, then retry on its node
    retry_blocked: Callable[[str], None]  # retry the records refused on a node for a full card


@dataclass
class _Hold:
    claim: ClaimObject
    key: str = ""  # the ledger key it counts under ("" while it holds none)
    got: Allocation | None = None  # its own reading while it has a key (counted, or refused)
    was_reserved: bool = False


def _merged(total: Allocation | None, more: Allocation) -> Allocation:
    """``total`` and ``more`` (one pod's claims, one node) as one allocation: shares per card summed."""
    if total is None:
        return more
    units = {s.uuid: s for s in total.cards}
    for s in more.cards:
        held = units.get(s.uuid)
        units[s.uuid] = s if held is None else replace(held, units=held.units + s.units)
    return replace(total, cards=tuple(units.values()))


class ClaimBook:
    """Claims seen, the keys they hold, and the annotation records they set aside."""

    def __init__(self, ledger: Counting) -> None:
        self._ledger = ledger
        self._claims: dict[str, _Hold] = {}  # claim namespace/name -> its hold
        self._by_key: dict[str, set[str]] = {}  # ledger key -> the claims it sums
        self._aside: dict[str, Allocation] = {}  # pod key -> its annotation allocation, not counted
        self._ignored: dict[str, ClaimIgnored] = {}  # claim -> why it holds nothing
        self._retrying = False

    # ---- reading ------------------------------------------------------------------------------
    def holds(self, key: str) -> bool:
        """Whether ``key``'s units are claims' (the pod's annotation record is set aside)."""
        return key in self._by_key

    def claims(self) -> list[str]:
        return sorted(self._claims)

    def allocation_of(self, cid: str) -> Allocation | None:
        """What claim ``cid`` itself holds, counted or waiting for its node; else None."""
        hold = self._claims.get(cid)
        if hold is None or not hold.key or cid in self._ignored:
            return None
        return hold.got if self._ledger.allocation(hold.key) is not None else None

    def named(self, rec: IgnoredRecord) -> IgnoredRecord:
        """``rec`` as its claim's message says it, when claims hold its key."""
        cids = self._by_key.get(rec.key)
        if not cids or isinstance(rec, ClaimIgnored):
            return rec
        return ClaimIgnored(**{**rec.__dict__, "claim": ", ".join(sorted(cids))})

    def ignored(self) -> list[IgnoredRecord]:
        """Claims that hold nothing and why, and claims counted once for several pods."""
        several = [
            shared(h.claim, h.got.node)
            for cid, h in self._claims.items()
            if h.key and h.got is not None and cid not in self._ignored
        ]
        return [*self._ignored.values(), *(rec for rec in several if rec is not None)]

    # ---- events -----------------------------------------------------------------------------------
    def observe(self, claim: ClaimObject, deleted: bool = False) -> IgnoredRecord | None:
        cid = claim.key
        hold = self._claims.get(cid)
        if hold is not None and claim.uid and hold.claim.uid and claim.uid != hold.claim.uid:
            self._let_go(cid)  # another claim of that name: the old one is gone
            hold = None
        if deleted or not claim.ours:  # another driver's claim is not kept
            self._let_go(cid)
            self._claims.pop(cid, None)
            return None
        was_reserved = bool(claim.reserved_for) or (hold is not None and hold.was_reserved)
        if hold is None:
            hold = self._claims[cid] = _Hold(claim=claim)
        hold.claim, hold.was_reserved = claim, was_reserved
        if was_reserved and not claim.reserved_for:
            self._let_go(cid)  # no longer reserved: its pod is gone
            return None
        got = claim_reading(claim, self._ledger.node, self._ledger.names)
        if not isinstance(got, Allocation):
            self._let_go(cid)
            if got is not None:
                self._ignored[cid] = got
            return got
        before = hold.got
        same = before is not None and (before.node, before.cards) == (got.node, got.cards)
        if same and hold.key == got.key:
            return None if cid in self._ignored else shared(claim, got.node)
        self._let_go(cid)
        if got.key not in self._by_key:
            self._set_aside(got.key)
        hold.key, hold.got = got.key, got
        self._by_key.setdefault(got.key, set()).add(cid)
        self._recount(got.key)
        return self._ignored.get(cid) or shared(claim, got.node)

    def set_aside(self, obj: PodObject, deleted: bool) -> None:
        """A pod event for a key claims hold: keep its annotation allocation aside, uncounted."""
        key = obj.key
        got = None if deleted else read_allocation(obj, self._ledger.node, self._ledger.names)
        if isinstance(got, Allocation):
            self._aside[key] = got
        else:
            self._aside.pop(key, None)

    def node_known(self, node: str) -> list[IgnoredRecord]:
        """Read again the claims on ``node`` that hold nothing (it was unknown, or its cards changed)."""
        out = []
        for _, hold in sorted(self._claims.items()):
            if not hold.key and claim_node(hold.claim) == node:
                rec = self.observe(hold.claim)
                if rec is not None:
                    out.append(rec)
        return out

    def retry(self, node: str) -> None:
        """Units on ``node`` came back: count the claims refused there for a full card, if they fit."""
        if self._retrying:
            return
        self._retrying = True
        try:
            for key in sorted(
                {
                    self._claims[cid].key
                    for cid, rec in self._ignored.items()
                    if rec.reason is Ignored.CARD_FULL and rec.node == node and self._claims[cid].key
                }
            ):
                self._recount(key)
        finally:
            self._retrying = False

    # ---- holding and letting go ------------------------------------------------------------------
    def _set_aside(self, key: str) -> None:
        """Claims take ``key``: the pod's annotation allocation (counted or blocked) waits aside."""
        ledger = self._ledger
        annotated = ledger.allocation(key) or ledger.blocked.get(key)
        ledger.blocked.pop(key, None)
        ledger.ignored.pop(key, None)
        if annotated is not None:
            ledger.drop(key)  # no retry yet: the claims count first
            self._aside[key] = replace(annotated, assumed=False)

    def _recount(self, key: str) -> None:
        """Count under ``key`` the sum of its claims that fit, in the claims' order; refuse the rest."""
        ledger = self._ledger
        old = ledger.drop(key)
        ledger.blocked.pop(key, None)
        ledger.ignored.pop(key, None)
        total: Allocation | None = None
        for cid in sorted(self._by_key.get(key, ())):
            self._ignored.pop(cid, None)
            fits = self._fits(total, self._claims[cid])
            if isinstance(fits, ClaimIgnored):
                self._ignored[cid] = fits
            else:
                total = fits
        if total is not None:
            ledger.add(total)  # checked above: it counts (or waits for its node)
        if old is not None and (total is None or total.units < old.units):
            ledger.retry_blocked(old.node)

    def _fits(self, total: Allocation | None, hold: _Hold) -> Allocation | ClaimIgnored:
        """``total`` with ``hold``'s claim added, or why the claim cannot count beside it."""
        got = hold.got
        assert got is not None
        if total is not None and got.node != total.node:
            detail = f"its pod's other ResourceClaims are on node {total.node}, this one on {got.node}"
            return ignored_claim(hold.claim, Ignored.WRONG_NODE, detail, got.node)
        state = self._ledger.state(got.node)
        if state is None:
            return _merged(total, got)  # its node went: it waits with the others
        used = dict(state.used)
        for s in total.cards if total is not None else ():
            used[s.uuid] = used.get(s.uuid, 0) + s.units
        checked = check_on_node(got, state.node, used)
        if isinstance(checked, IgnoredRecord):
            return ClaimIgnored(**{**checked.__dict__, "claim": hold.claim.key})
        return _merged(total, checked)

    def _let_go(self, cid: str) -> None:
        """The claim holds nothing any more: its units go back; once its pod's last claim lets
        go, the pod's annotation counts again."""
        self._ignored.pop(cid, None)
        hold = self._claims.get(cid)
        if hold is None or not hold.key:
            return
        key, hold.key, hold.got = hold.key, "", None
        cids = self._by_key.get(key)
        if cids is None or cid not in cids:
            return
        cids.discard(cid)
        if cids:
            self._recount(key)
            return
        del self._by_key[key]
        ledger = self._ledger
        ledger.blocked.pop(key, None)
        ledger.ignored.pop(key, None)
        ledger.release(key)
        aside = self._aside.pop(key, None)
        if aside is not None:
            ledger.add(aside)
