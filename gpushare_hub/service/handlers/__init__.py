"""The service's tornado handlers, one module per resource (as JupyterHub's ``apihandlers``).

- :mod:`.base`: :class:`~.base.BaseHandler`, which every handler extends: who calls, what they
  may see, errors as JSON or a short page, the body limit;
- :mod:`.ledger`: ``api/v1/ledger`` and ``api/v1/availability``;
- :mod:`.me`: ``api/v1/me`` and ``api/v1/me/keep``, the caller's own slices;
- :mod:`.budgets`: ``api/v1/budgets`` and ``api/v1/budgets/<user>``, the GiB·h budgets;
- :mod:`.history`: ``api/v1/history``, every slice held;
- :mod:`.planning`: ``api/v1/planning``, the history replayed against other clusters;
- :mod:`.pages`: the dashboard, ``metrics``, the OAuth callback, the prefix's redirect and the
  404 of every other path.

Each module ends in its ``handlers`` list (paths below the service's prefix, as JupyterHub's
``default_handlers``); :func:`handler_list` gathers them, and
:meth:`~gpushare_hub.service.app.GPUShareService.make_app` routes them under the prefix. Each
method says what it needs with :func:`~.base.requires`.

Access: every handler needs ``access:services!service=<name>`` (JupyterHub's default for a
service); the rest is decided on the token's own scopes (:mod:`gpushare_hub.service.access`):
the admin routes need ``custom:<name>:admin`` (or a hub admin's ``admin:users`` /
``admin-ui``) on the token, ``metrics`` ``custom:<name>:metrics``; a server token may call
``api/v1/me`` and Keep only.
"""

from __future__ import annotations

from typing import Any


def handler_list() -> list[tuple[str, Any]]:
    """Every module's ``handlers``, the dashboard's first (paths below the service's prefix)."""
    from . import budgets, history, ledger, me, pages, planning

    return [route for module in (pages, ledger, me, budgets, history, planning) for route in module.handlers]
