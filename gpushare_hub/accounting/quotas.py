"""The GPU quotas' and GiB-hour budgets' settings, declared once for the two that read them:
``GPUShareSpawner`` (it refuses a spawn over a quota or with the budget spent, and shows the
budget on the spawn form) and the hub service (it counts the GiB·h, warns and acts on spent
budgets, and shows both on the dashboard and in the metrics). ``configure_hub`` passes the
spawner's values to the service, so an admin sets them once, on ``c.GPUShareSpawner``.

A mixin of plain traits: each class that inherits it keeps its own config section.
"""

from __future__ import annotations

from typing import Any

from traitlets import Dict, Enum, Float, HasTraits, Integer, TraitError, Unicode, validate

from gpushare_hub.core.budget import WINDOWS

from .zones import budget_zone


class QuotaSettings(HasTraits):
    """``quota_gib_*``: what one user may hold at once, and within a window."""

    quota_gib_per_user = Integer(
        None,
        allow_none=True,
        config=True,
        help="""
        GiB of GPU memory one user may hold at once, summed over all their servers (named
        servers included; a whole card counts as its size). ``None`` (default): no limit.
        A spawn over quota is refused, naming the servers that use it; the service's metrics
        report each group's use against it.
        """,
    )
    quota_gib_per_group = Dict(
        key_trait=Unicode(),
        value_trait=Integer(),
        config=True,
        help="""
        Per-group overrides of ``quota_gib_per_user``: ``{"gpu-power-users": 30}``. A member of
        several listed groups gets the largest of their quotas.
        """,
    )
    quota_gib_hours = Float(
        None,
        allow_none=True,
        min=0,
        config=True,
        help="""
        GiB·h of GPU memory one user may hold within each budget window
        (``quota_gib_hours_window``): a 5 GiB slice held 8 hours uses 40, busy or not.
        ``None`` (default): no budget. The spawn form shows what is used and what a slice would
        use; a spawn with the budget spent is refused until the window resets, and the hub
        service warns, then stops or parks, servers still holding slices
        (``c.GPUShareService.budget_action``). Admins add to a user's window on the dashboard.
        Counted by the hub service (``configure_hub``) from the API server's record of each
        pod, in its book (the spawner's ``budget_db``).
        """,
    )
    quota_gib_hours_per_group = Dict(
        key_trait=Unicode(),
        value_trait=Float(min=0),
        config=True,
        help="""
        Per-group overrides of ``quota_gib_hours``: ``{"thesis-students": 400}``. Each member
        gets that budget of their own (a group's members do not share one); a member of several
        listed groups gets the largest.
        """,
    )
    quota_gib_hours_window = Enum(
        WINDOWS,
        default_value="week",
        config=True,
        help="""
        The window a GiB·h budget covers: ``"day"`` (from midnight), ``"week"`` (from Monday
        00:00) or ``"month"`` (from the 1st), in ``quota_gib_hours_timezone``.
        """,
    )
    quota_gib_hours_timezone = Unicode(
        "UTC",
        config=True,
        help="""
        The IANA time zone (``"Europe/Berlin"``) whose midnight starts a budget window, so that a
        week ends when your users' week ends.
        """,
    )

    @validate("quota_gib_hours_timezone")
    def _validate_timezone(self, proposal: Any) -> str:
        name = str(proposal["value"])
        try:
            budget_zone(name)
        except ValueError as err:
            raise TraitError(str(err)) from None
        return name


# What configure_hub passes from the spawner's settings to the service's.
QUOTA_SETTINGS = tuple(sorted(QuotaSettings.class_own_traits(config=True)))
