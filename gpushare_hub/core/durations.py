"""How long something took or will take, in words a person reads, and what a slice taken back
for sitting idle on the GPU is called. Pure: one place for every message that says either (the
hub service's documents and events, the spawn page, the notebook's status bar, the planner, the
demo); ``kubectl inspect gpushare``'s table keeps kubectl's own compact column (:func:`compact`).
"""

from __future__ import annotations

import math

MINUTE, HOUR, DAY = 60, 3600, 86400


def duration_words(seconds: float) -> str:
    """``40 s``, ``7 min``, ``2 h``, ``1 h 50 min``, ``3 days 4 h`` (rounded down to the unit
    shown; negative and non-finite spans read as ``0 s``)."""
    whole = int(seconds) if math.isfinite(seconds) and seconds > 0 else 0
    if whole < MINUTE:
        return f"{whole} s"
    if whole < HOUR:
        return f"{whole // MINUTE} min"
    if whole < 2 * DAY:
        hours, minutes = divmod(whole // MINUTE, 60)
        return f"{hours} h" + (f" {minutes} min" if minutes else "")
    days, hours = divmod(whole // HOUR, 24)
    return f"{days} days" + (f" {hours} h" if hours else "")


def compact(seconds: float) -> str:
    """kubectl's column style: ``45s``, ``7m``, ``2h05m``, ``3d4h``."""
    whole = int(seconds) if math.isfinite(seconds) and seconds > 0 else 0
    if whole >= 2 * DAY:
        return f"{whole // DAY}d{whole % DAY // HOUR}h"
    if whole >= HOUR:
        return f"{whole // HOUR}h{whole % HOUR // MINUTE:02d}m"
    return f"{whole // MINUTE}m" if whole >= MINUTE else f"{whole}s"


def returned_words(size: str, idle_seconds: float) -> str:
    """``your 5 GiB slice was returned after 2 h idle on the GPU``: the one sentence for a slice
    the hub service took back (``size`` names the slice: ``5 GiB slice``, ``Tesla T4 · 5 GiB
    slice``); callers add what happened to the server and how to get the slice back."""
    return f"your {size} was returned after {duration_words(idle_seconds)} idle on the GPU"
