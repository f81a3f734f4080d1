"""Talking to the API server: raw calls with timeouts (``api.py``) and the ledger informer (``informer.py``).

Every component that keeps a ledger (the extender, the hub's spawner, the hub
service, the CLI) keeps it current with :class:`LedgerInformer`.
"""

from .api import DEFAULT_TIMEOUTS, ApiError, Timeouts, make_api_client
from .informer import LedgerInformer

__all__ = ["DEFAULT_TIMEOUTS", "ApiError", "LedgerInformer", "Timeouts", "make_api_client"]
