"""The ledger's book of ResourceClaims: which claim holds units under which key. Pure.

:meth:`~.ledger.Ledger.observe_claim` hands each claim event here; the units themselves are
counted by the ledger exactly as an annotation's (its ``_add``/``release``, the rule of
:mod:`.records`), so ``snapshot()``, availability, the dashboard, quotas, budgets, history and
idle return see a claim's allocation like any other.

Rules beyond :mod:`.claims`:

* One allocation per pod. A pod that holds our claim *and* carries an annotation record counts
  the claim: kube-scheduler writes it through the status subresource and the kubelet prepares
  exactly that, while a node serves one path only, so the annotation is set aside (kept, and
  counted again once the claim lets go). A second claim of ours for the same pod is ignored.
* A claim that was reserved for a pod and is no longer (the pod went) releases its units even
  while still allocated; one allocated and never yet reserved holds them under its own key.
* A claim on a node the ledger does not know waits, and is read again when the node comes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .claims import ClaimIgnored, ClaimObject, claim_node, claim_reading, ignored_claim
from .objects import PodObject
from .records import Allocation, Ignored, IgnoredRecord, read_allocation

if TYPE_CHECKING:
    from .ledger import Ledger


@dataclass
class _Hold:
    claim: ClaimObject
    key: str = ""  # the ledger key its units are under ("" while it holds none)
    was_reserved: bool = False


class ClaimBook:
    """Claims seen, the keys they hold, and the annotation records they set aside."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._claims: dict[str, _Hold] = {}  # claim namespace/name -> its hold
        self._by_key: dict[str, str] = {}  # ledger key -> the claim holding it
        self._aside: dict[str, Allocation] = {}  # pod key -> its annotation allocation, not counted
        self._ignored: dict[str, ClaimIgnored] = {}  # claim -> why it holds nothing

    # ---- reading ------------------------------------------------------------------------------
    def holds(self, key: str) -> bool:
        """Whether ``key``'s units are a claim's (the pod's annotation record is set aside)."""
        return key in self._by_key

    def claims(self) -> list[str]:
        return sorted(self._claims)

    def key_of(self, cid: str) -> str:
        """The ledger key claim ``cid`` holds units under ("" for none)."""
        hold = self._claims.get(cid)
        return hold.key if hold is not None else ""

    def named(self, rec: IgnoredRecord) -> IgnoredRecord:
        """``rec`` as its claim's message says it, when a claim holds its key."""
        cid = self._by_key.get(rec.key)
        if cid is None or isinstance(rec, ClaimIgnored):
            return rec
        return ClaimIgnored(**{**rec.__dict__, "claim": cid})

    def ignored(self) -> list[IgnoredRecord]:
        return list(self._ignored.values())

    # ---- events -----------------------------------------------------------------------------------
    def observe(self, claim: ClaimObject, deleted: bool = False) -> IgnoredRecord | None:
        cid = claim.key
        hold = self._claims.get(cid)
        if hold is not None and claim.uid and hold.claim.uid and claim.uid != hold.claim.uid:
            self._let_go(cid)  # another claim of that name: the old one is gone
            hold = None
        if deleted:
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
        held = self._ledger.allocation(got.key)
        if hold.key == got.key and held is not None and (held.node, held.cards) == (got.node, got.cards):
            return None
        self._let_go(cid)
        other = self._by_key.get(got.key)
        if other is not None:
            rec = ignored_claim(claim, Ignored.WRONG_AMOUNT, f"its pod holds ResourceClaim {other} already")
            self._ignored[cid] = rec
            return rec
        return self._take(cid, got)

    def set_aside(self, obj: PodObject, deleted: bool) -> None:
        """A pod event for a key a claim holds: keep its annotation allocation aside, uncounted."""
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

    # ---- holding and letting go ------------------------------------------------------------------
    def _take(self, cid: str, alloc: Allocation) -> IgnoredRecord | None:
        ledger = self._ledger
        key = alloc.key
        annotated = ledger.allocation(key) or ledger._blocked.get(key)
        ledger._blocked.pop(key, None)
        ledger._forget_ignored(key, "")
        if annotated is not None:
            ledger.release(key)
            self._aside[key] = replace(annotated, assumed=False)
        self._claims[cid].key = key
        self._by_key[key] = cid
        refused = ledger._add(alloc)
        if refused is None:
            return None
        named = self.named(refused)
        ledger._ignored[key] = named
        return named

    def _let_go(self, cid: str) -> None:
        """The claim holds nothing any more: its units go back, its pod's annotation counts again."""
        self._ignored.pop(cid, None)
        hold = self._claims.get(cid)
        if hold is None or not hold.key:
            return
        key, hold.key = hold.key, ""
        if self._by_key.get(key) != cid:
            return
        del self._by_key[key]
        ledger = self._ledger
        ledger._blocked.pop(key, None)
        ledger._ignored.pop(key, None)
        ledger.release(key)
        aside = self._aside.pop(key, None)
        if aside is not None:
            ledger._add(aside)
