"""The GiB-hour budgets' time zone (``quota_gib_hours_timezone``): where a day, a week or a month
of a budget begins. Checked here once for the spawner, ``configure_hub`` and the hub service."""

from __future__ import annotations

import zoneinfo


def budget_zone(name: object, setting: str = "quota_gib_hours_timezone") -> zoneinfo.ZoneInfo:
    """The zone named ``name``; a ValueError naming ``setting``, the value and the fix otherwise."""
    fix = "use an IANA name such as 'UTC' or 'Europe/Berlin'"
    if not isinstance(name, str):
        raise ValueError(f"{setting} {name!r} is not a time zone; {fix}")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as err:
        raise ValueError(f"{setting} {name!r} is not a time zone ({err}); {fix}") from None
