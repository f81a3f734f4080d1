"""Talking to the API server: raw calls with timeouts (``api.py``), the ledger informer
(``informer.py``), a small synchronous reader for short-lived commands (``rest.py``), and the
kubeconfig they read (``kubeconfig.py``).

Every component that keeps a ledger (the extender, the hub's spawner, the hub service) keeps it
current with :class:`LedgerInformer`. The names below are imported on first use, so that
``gpushare_hub.kube.kubeconfig`` and ``gpushare_hub.kube.rest`` (the CLI) load no asynchronous
client.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import DEFAULT_TIMEOUTS, ApiError, Timeouts, make_api_client
    from .informer import LedgerInformer

_WHERE = {
    "DEFAULT_TIMEOUTS": "api",
    "ApiError": "api",
    "Timeouts": "api",
    "make_api_client": "api",
    "LedgerInformer": "informer",
}

__all__ = ["DEFAULT_TIMEOUTS", "ApiError", "LedgerInformer", "Timeouts", "make_api_client"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
