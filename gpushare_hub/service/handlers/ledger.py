"""``api/v1/ledger`` (the admin's view of every card and slice) and ``api/v1/availability``
(per slice of the catalogue, whether one can be had now; for every caller)."""

from __future__ import annotations

from datetime import UTC, datetime

from ..query import FILTER_KEYS
from ..view import availability_document
from .base import BaseHandler


class LedgerHandler(BaseHandler):
    def get(self) -> None:
        self.caller()
        self.require(self.service.admin_scope, "Reading the ledger")
        self.send(self.ledger_doc(self.filters(FILTER_KEYS)))


class AvailabilityHandler(BaseHandler):
    def get(self) -> None:
        self.caller()
        self.filters(())
        svc = self.service
        self.send(
            availability_document(self.cluster.ledger(), svc.catalogue, svc.node_selector, datetime.now(UTC))
        )
