"""What JupyterHub stores of a spawn request's ``user_options``, bounded.

JupyterHub writes the ``user_options`` of a REST spawn request into its database (the Spawner
row) before any spawner code sees them, and decodes them again whenever it loads that row. Options
nested some hundreds of levels deep are stored, then cannot be decoded deep in a request's stack
(``RecursionError``); since JupyterHub loads every Spawner row to count active servers, every later
spawn on the hub, of any user, then fails with HTTP 500 until the row is cleaned by hand. (Found by
the fuzz tier against JupyterHub 6.1.1; a few bodies even fail to encode, and that request alone
gets a 500.)

:func:`guard_stored_options` makes JupyterHub store ``{}`` instead of options that nest deeper or
weigh more than :func:`~.options.options_problem` allows; the request itself is then refused by
:meth:`GPUShareSpawner.load_user_options` with a 400 naming the problem. Registered once, when the
spawner class is imported into the hub.
"""

from __future__ import annotations

import logging
from typing import Any

from jupyterhub import orm  # type: ignore[import-untyped]
from sqlalchemy import event

from .options import options_problem

log = logging.getLogger("gpushare.spawner")


def _bounded(target: Any, value: Any, oldvalue: Any, initiator: Any) -> Any:
    problem = options_problem(value) if value is not None else None
    if problem is None:
        return value
    log.warning("user options not stored for server %s: %s", getattr(target, "name", "?"), problem)
    return {}


def guard_stored_options() -> None:
    """Install the bound on ``orm.Spawner.user_options`` (idempotent)."""
    if not event.contains(orm.Spawner.user_options, "set", _bounded):
        event.listen(orm.Spawner.user_options, "set", _bounded, retval=True)
