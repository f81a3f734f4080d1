"""The ledger's side of the informer: each object the API server sends (a list's or a watch's),
read (:mod:`gpushare_hub.core.shapes`), applied to the one :class:`~gpushare_hub.core.ledger.Ledger`
of the process, then told to the subscribers (``on_pod``, ``on_node``, ``on_claim``,
``on_ignored``, ``on_unreadable``); what they were told is remembered, so that a relist can take
back what vanished. Ends of allocations go into the release history. No I/O:
:class:`~gpushare_hub.kube.informer.LedgerInformer` lists and watches, and feeds this.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..core.claims import ClaimObject, read_claim
from ..core.errors import GPUShareError, InvalidObject
from ..core.ledger import Ledger
from ..core.objects import NodeObject, PodObject, pod_key
from ..core.records import Allocation, IgnoredRecord
from ..core.releases import Release, ReleaseHistory
from ..core.resources import DEFAULT_NAMES, ResourceNames
from ..core.shapes import read_node, read_pod

log = logging.getLogger("gpushare.informer")

Handler = Callable[[str, Any], None]  # (event type, the PodObject or NodeObject)
PodFilter = Callable[[PodObject], bool]
IgnoredHandler = Callable[[IgnoredRecord], None]
UnreadableHandler = Callable[[str, str], None]  # (node name, why its inventory cannot be read)
KINDS = ("nodes", "pods")
CLAIMS = "resourceclaims"  # watched beside KINDS where the API server serves them
ALL_KINDS = (*KINDS, CLAIMS)


class LedgerFeed:
    """Objects into the ledger, then to the subscribers (see the module docstring)."""

    def __init__(
        self,
        names: ResourceNames = DEFAULT_NAMES,
        keep_pod: PodFilter | None = None,
        releases: ReleaseHistory | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = Ledger(names)
        self.names = names
        self.keep_pod = keep_pod
        self.releases = releases
        self._clock = clock
        self._handlers: dict[str, list[Handler]] = {k: [] for k in ALL_KINDS}
        # What the subscribers were last told exists (key -> identity), so that a relist can
        # report every object that vanished meanwhile, not only those holding a card.
        self._reported: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in ALL_KINDS}
        self._ignored_handlers: list[IgnoredHandler] = []
        self._unreadable_handlers: list[UnreadableHandler] = []

    # ---- subscribing ---------------------------------------------------------------------
    def on_pod(self, handler: Handler) -> None:
        """Call ``handler(event type, pod)`` after the ledger applied each pod event (the pod as a
        :class:`~gpushare_hub.core.objects.PodObject`, read once here)."""
        self._handlers["pods"].append(handler)

    def on_node(self, handler: Handler) -> None:
        """Call ``handler(event type, node)`` after the ledger applied each node event (a
        :class:`~gpushare_hub.core.objects.NodeObject`)."""
        self._handlers["nodes"].append(handler)

    def on_claim(self, handler: Handler) -> None:
        """Call ``handler(event type, claim)`` after the ledger applied each ResourceClaim event (a
        :class:`~gpushare_hub.core.claims.ClaimObject`): what the ledger counts may have changed."""
        self._handlers[CLAIMS].append(handler)

    def on_ignored(self, handler: IgnoredHandler) -> None:
        """Call ``handler(record)`` for each allocation record the ledger refused to count
        (see :mod:`gpushare_hub.core.records`)."""
        self._ignored_handlers.append(handler)

    def on_unreadable(self, handler: UnreadableHandler) -> None:
        """Call ``handler(node, reason)`` each time a Node's card inventory cannot be read (the
        node is out of placement until it can)."""
        self._unreadable_handlers.append(handler)

    def _unreadable(self, node: str, reason: str) -> None:
        self.ledger.mark_unreadable(node, reason)
        for handler in self._unreadable_handlers:
            try:
                handler(node, reason)
            except Exception:
                log.exception("an unreadable-node handler failed")

    def _tell_ignored(self, records: list[IgnoredRecord]) -> None:
        for rec in records:
            for handler in self._ignored_handlers:
                try:
                    handler(rec)
                except Exception:
                    log.exception("an ignored-record handler failed")

    # ---- applying objects ----------------------------------------------------------------
    def apply(self, kind: str, etype: str, obj: Mapping[str, Any]) -> None:
        """Read one event's object (:mod:`gpushare_hub.core.shapes`), apply it to the ledger,
        then tell the subscribers. An object that cannot be read is left out, with the field
        named in the log (the API server validates what it stores, so this is a bug elsewhere)."""
        deleted = etype == "DELETED"
        if kind == CLAIMS:
            self._apply_claim(etype, obj)
            return
        typed: NodeObject | PodObject
        try:
            typed = read_node(obj) if kind == "nodes" else read_pod(obj)
        except InvalidObject as err:
            name = str((obj.get("metadata") or {}).get("name", "?")) if kind == "nodes" else pod_key(obj)
            log.warning("cannot read %s %s (%s); it is left out", kind[:-1], name, err)
            if kind == "nodes":
                self._unreadable(name, f"cannot be read ({err})")
            return
        if isinstance(typed, NodeObject):
            self._apply_node(typed, deleted)
            key = typed.name
        else:
            self._apply_pod(typed, deleted)
            key = typed.key
        reported = self._reported[kind]
        if isinstance(typed, PodObject) and self.keep_pod is not None:
            if not deleted and not self.keep_pod(typed):
                etype, deleted = "DELETED", True  # it no longer can: subscribers forget it
            if deleted and key not in reported:
                return  # never told: nothing to take back
        if deleted:
            reported.pop(key, None)
        elif isinstance(typed, PodObject):
            reported[key] = {"namespace": typed.namespace, "name": typed.name, "uid": typed.uid}
        else:
            reported[key] = {"name": typed.name, "uid": typed.uid}
        for handler in self._handlers[kind]:
            try:
                handler(etype, typed)
            except Exception:
                log.exception("a %s event handler failed", kind)

    def _apply_node(self, obj: NodeObject, deleted: bool) -> None:
        if deleted:
            self.ledger.remove_node(obj.name)
            return
        try:
            self._tell_ignored(self.ledger.observe_node(obj))
        except GPUShareError as err:
            # Never keep the old cards of a node whose inventory broke: take it out of
            # placement, keep its pods' holds (they wait in the ledger), and say why.
            log.warning("node %s: %s", obj.name, err)
            self._unreadable(obj.name, str(err))

    def _apply_claim(self, etype: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        deleted = etype == "DELETED"
        try:
            claim = read_claim(obj)
        except InvalidObject as err:
            if not deleted:
                log.warning("cannot read a ResourceClaim (%s); it is left out", err)
                return
            claim = ClaimObject(namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""))
        reported = self._reported[CLAIMS]
        if claim.key not in reported and (deleted or not claim.ours):
            return  # not ours and never told: nothing counted, kept or told
        if not deleted and not claim.ours:
            etype, deleted = "DELETED", True  # no longer ours: forgotten, as if deleted
        before = self.ledger.claim_allocation(claim.key) if self.releases is not None else None
        try:
            ignored = self.ledger.observe_claim(claim, deleted=deleted)
        except GPUShareError as err:
            log.warning("ignoring ResourceClaim %s: %s", claim.key, err)
        else:
            if ignored is not None:
                self._tell_ignored([ignored])
        if before is not None:
            self._released(before, self.ledger.claim_allocation(claim.key) is None)
        if deleted:
            reported.pop(claim.key, None)
        else:
            reported[claim.key] = {"namespace": claim.namespace, "name": claim.name, "uid": claim.uid}
        for handler in self._handlers[CLAIMS]:
            try:
                handler(etype, claim)
            except Exception:
                log.exception("a resourceclaims event handler failed")

    def _apply_pod(self, obj: PodObject, deleted: bool) -> None:
        before = self.ledger.allocation(obj.key) if self.releases is not None else None
        try:
            ignored = self.ledger.observe_pod(obj, deleted=deleted)
        except GPUShareError as err:
            log.warning("ignoring pod %s: %s", obj.key, err)
        else:
            if ignored is not None:
                self._tell_ignored([ignored])
        if before is not None:
            self._released(before, self.ledger.allocation(obj.key) is None)

    def _released(self, before: Allocation, gone: bool) -> None:
        """Record ``before``'s release in the history if it is ``gone`` from the ledger."""
        if self.releases is not None and gone:
            node = self.ledger.node(before.node)
            card = node.card(before.cards[0].uuid) if node is not None and before.cards else None
            if card is not None:
                units = min(share.units for share in before.cards)
                self.releases.add(Release(self._clock(), card.model, units, len(before.cards)))
