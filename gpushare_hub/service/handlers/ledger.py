"""``api/v1/ledger`` (the admin's view of every card and slice) and ``api/v1/availability``
(per slice of the catalogue, whether one can be had now; for every caller)."""

from __future__ import annotations

from datetime import UTC, datetime

from ..query import FILTER_KEYS
from ..view import availability_document
from .base import ADMIN, BaseHandler, requires


class LedgerHandler(BaseHandler):
    @requires(ADMIN, "Reading the ledger")
    def get(self) -> None:
        self.send(self.ledger_doc(self.filters(FILTER_KEYS)))


class AvailabilityHandler(BaseHandler):
    @requires()
    def get(self) -> None:
        self.filters(())
        svc = self.service
        self.send(
            availability_document(self.cluster.ledger(), svc.catalogue, svc.node_selector, datetime.now(UTC))
        )


handlers = [("api/v1/ledger", LedgerHandler), ("api/v1/availability", AvailabilityHandler)]
