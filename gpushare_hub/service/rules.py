"""The rules the service builds from its settings once the configuration is loaded (the idle
rule, the GiB-hour budgets' rule), each checked: a setting that cannot work is a
:class:`ServiceConfigError` naming it and the fix, before the service starts."""

from __future__ import annotations

import json

from traitlets.config import Config

from gpushare_hub.accounting.zones import budget_zone
from gpushare_hub.core.catalogue import Catalogue

from .budgets import BudgetRule
from .hubconfig import CONFIG_ENV
from .idle import PARK, IdleRule
from .overslice import OverSliceRule
from .settings import ServiceSettings


class ServiceConfigError(ValueError):
    """The service's settings cannot be used; the message names the setting and the fix."""


def env_config(text: str) -> Config:
    """The settings ``configure_hub`` passes in ``$GPUSHARE_SERVICE_CONFIG`` (:data:`CONFIG_ENV`)."""
    try:
        settings = json.loads(text)
    except ValueError as err:
        raise ServiceConfigError(
            f"${CONFIG_ENV} is not JSON ({err}); configure_hub() writes it, or set it to "
            '{"GPUShareService": {...}}'
        ) from None
    if not isinstance(settings, dict) or not all(isinstance(v, dict) for v in settings.values()):
        raise ServiceConfigError(
            f"${CONFIG_ENV} must be a JSON object of sections, e.g. "
            '{"GPUShareService": {"slices": [...]}}'
        )
    return Config(settings)


def budget_rule(settings: ServiceSettings) -> BudgetRule:
    """The GiB-hour budgets' rule from the settings; :class:`ServiceConfigError` naming a wrong one."""
    try:
        tz = budget_zone(settings.quota_gib_hours_timezone)
    except ValueError as err:
        raise ServiceConfigError(str(err)) from None
    rule = BudgetRule(
        per_user=settings.quota_gib_hours,
        per_group=dict(settings.quota_gib_hours_per_group),
        window=settings.quota_gib_hours_window,
        tz=tz,
        grace=settings.budget_grace_seconds,
        action=settings.budget_action,
        park_profile=settings.gpu_idle_park_profile,
    )
    if rule.configured and rule.action == PARK and not rule.park_profile:
        raise ServiceConfigError(
            'budget_action is "park" but gpu_idle_park_profile is empty: name the spawner\'s '
            "CPU-only profile_list slug a parked server starts on"
        )
    return rule


def over_slice_rule(settings: ServiceSettings) -> OverSliceRule:
    """The over-slice rule from the settings (the traits check their values)."""
    return OverSliceRule(
        settings.over_slice_action, settings.over_slice_after, settings.over_slice_warn_before
    )


def idle_rule(settings: ServiceSettings, catalogue: Catalogue) -> IdleRule:
    """The idle rule from the settings, checked against the catalogue's slices."""
    rule = IdleRule(
        action=settings.gpu_idle_action,
        per_group=dict(settings.gpu_idle_action_per_group),
        per_slice=dict(settings.gpu_idle_action_per_slice),
        exempt_groups=frozenset(settings.gpu_idle_exempt_groups),
        return_after=settings.gpu_idle_return_after,
        warn_before=settings.gpu_idle_warn_before,
        keep_seconds=settings.gpu_idle_keep_seconds,
        park_profile=settings.gpu_idle_park_profile,
    )
    parks = PARK in (rule.action, *rule.per_group.values(), *rule.per_slice.values())
    if parks and not rule.park_profile:
        raise ServiceConfigError(
            'an idle action is "park" but gpu_idle_park_profile is empty: name the spawner\'s '
            "CPU-only profile_list slug a parked server starts on"
        )
    slugs = {s.slug for s in catalogue.slices}
    if rule.park_profile in slugs:
        raise ServiceConfigError(
            f"gpu_idle_park_profile {rule.park_profile!r} is a GPU slice of the catalogue; name a "
            "CPU-only profile_list entry, so that a parked server holds no GPU"
        )
    unknown = sorted(set(rule.per_slice) - slugs)
    if unknown:
        raise ServiceConfigError(
            f"gpu_idle_action_per_slice names {', '.join(unknown)}, not slices of the catalogue "
            f"({', '.join(sorted(slugs)) or 'none'})"
        )
    return rule
