"""Server-side checks of what a user asked for (form or REST body), and GPU quotas.

``user_options`` are untrusted: they come from the spawn form, or raw from
``POST /hub/api/users/<u>/servers/<name>``. :func:`check_options` accepts only
``profile`` (a slug the user may use) and the chosen profile's own options with
one of their listed values; anything else is refused, so nothing of the request
reaches the pod unchecked. Outcomes are values; :meth:`Refused.text` is what the
user reads. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gpushare_hub.core.catalogue import Catalogue, Slice
from gpushare_hub.core.errors import InvalidObject
from gpushare_hub.core.shapes import check_depth, described, shown

UNLISTED = "--unlisted-choice"
# Bounds on a request's user_options, far past any form's (a flat object of a few strings): what
# JupyterHub may store of them (see :mod:`.stored`) and what :func:`check_options` reads.
MAX_OPTIONS_DEPTH = 8
MAX_OPTIONS_CHARS = 64 * 1024
# Sent by the hub service when it parks an idle slice's server on a CPU-only profile: what was
# returned, so that the spawn form can say so and offer that slice again. Words about the user's
# own server only; checked as strictly as any option.
RETURNED_KEY = "gpushare_returned"


def returned_problem(value: object) -> str | None:
    """What is wrong with a ``gpushare_returned`` option (None: it is the service's form)."""
    if not isinstance(value, Mapping) or set(value) != {"slice", "units", "idle_seconds"}:
        return f"{RETURNED_KEY} must be an object of slice, units and idle_seconds, got {described(value)}"
    slug, units, idle = value["slice"], value["units"], value["idle_seconds"]
    if not isinstance(slug, str) or len(slug) > 63:
        return f"{RETURNED_KEY}.slice must be a slice's slug, got {described(slug)}"
    for key, number, most in (("units", units, 1024), ("idle_seconds", idle, 10**8)):
        if not isinstance(number, int) or isinstance(number, bool) or not 0 <= number <= most:
            return f"{RETURNED_KEY}.{key} must be a whole number from 0 to {most}, got {described(number)}"
    return None


def options_problem(options: object) -> str | None:
    """Why ``options`` are too deep or too large to store or read, else None."""
    try:
        check_depth(options, MAX_OPTIONS_DEPTH)
    except InvalidObject:
        return f"user options nest deeper than {MAX_OPTIONS_DEPTH} levels"
    size = len(json.dumps(options, default=repr))
    if size > MAX_OPTIONS_CHARS:
        return f"user options are {size} characters of JSON, more than {MAX_OPTIONS_CHARS}"
    return None


class Reason(Enum):
    MALFORMED = "malformed"
    UNKNOWN_PROFILE = "unknown profile"
    UNKNOWN_KEY = "unknown option"
    BAD_CHOICE = "bad choice"
    GROUP = "not in group"
    QUOTA = "over quota"
    BUDGET = "budget spent"
    UNAVAILABLE = "unavailable"
    NEVER_FITS = "never fits"


@dataclass(frozen=True)
class Refused:
    """Why a spawn request is refused; ``text()`` says what was wrong and the way out."""

    reason: Reason
    detail: str
    fix: str = ""

    def text(self) -> str:
        return f"{self.detail}; {self.fix}" if self.fix else self.detail


@dataclass(frozen=True)
class Choice:
    """An accepted request: the profile to load and the slice it runs on (``None``: no GPU)."""

    profile: str | None
    slice: Slice | None


def _options_of(profile: Mapping[str, Any]) -> Mapping[str, Any]:
    opts = profile.get("profile_options") or {}
    return opts if isinstance(opts, Mapping) else {}


def check_options(
    options: Any, profiles: Sequence[Mapping[str, Any]], catalogue: Catalogue, groups: Iterable[str]
) -> Choice | Refused:
    """Check ``user_options`` against the initialised profile list the user was offered.

    ``profiles``: KubeSpawner's initialised profile list (every entry has a slug);
    ``groups``: the names of the user's hub groups.
    """
    if options is None:
        options = {}
    problem = options_problem(options)
    if problem:
        return Refused(Reason.MALFORMED, problem, 'send {"profile": "<slug>"}')
    if not isinstance(options, Mapping):
        return Refused(
            Reason.MALFORMED,
            f"user options must be a JSON object, got {described(options)}",
            'send {"profile": "<slug>"}',
        )
    groups = set(groups)
    slugs = [str(p["slug"]) for p in profiles]
    allowed = [s for s in slugs if (sl := catalogue.for_profile(s)) is None or sl.allows(groups)]
    profile_slug = options.get("profile")
    if profile_slug in (None, ""):
        if not profiles:
            profile = None
        else:
            profile = next((p for p in profiles if p.get("default")), profiles[0])
            profile_slug = str(profile["slug"])
    elif not isinstance(profile_slug, str) or profile_slug not in slugs:
        return Refused(
            Reason.UNKNOWN_PROFILE,
            f"there is no profile {shown(profile_slug)}",
            f"choose one of {', '.join(allowed) or '(none)'}",
        )
    else:
        profile = profiles[slugs.index(profile_slug)]
    chosen = catalogue.for_profile(profile_slug) if isinstance(profile_slug, str) else None
    if chosen is not None and not chosen.allows(groups):
        return Refused(
            Reason.GROUP,
            f"{chosen.display_name!r} ({chosen.slug}) is only for members of {', '.join(chosen.groups)}",
            f"choose one of {', '.join(allowed) or '(none)'}, "
            "or ask an admin to add you to one of those groups",
        )
    offered = _options_of(profile) if profile is not None else {}
    for key, value in options.items():
        if key == "profile":
            continue
        if key == RETURNED_KEY:
            problem = returned_problem(value)
            if problem:
                return Refused(Reason.BAD_CHOICE, problem, "leave it out: the hub service writes it")
            continue
        name = key[: -len(UNLISTED)] if isinstance(key, str) and key.endswith(UNLISTED) else key
        if name not in offered:
            known = ", ".join(sorted(["profile", *offered])) or "profile"
            return Refused(
                Reason.UNKNOWN_KEY,
                f"option {shown(key)} is not offered by profile {shown(profile_slug)} (resources come "
                "from the profile, not from the request)",
                f"send only {known}",
            )
        if not isinstance(value, str):
            return Refused(
                Reason.BAD_CHOICE,
                f"option {shown(key)} must be a string, got {described(value)}",
                "send one of the listed choices",
            )
        option = offered[name]
        if key != name:
            unlisted = option.get("unlisted_choice") or {}
            regex = unlisted.get("validation_regex")
            if not unlisted.get("enabled"):
                return Refused(
                    Reason.BAD_CHOICE,
                    f"option {name!r} takes no free-text value",
                    f"choose one of {', '.join(option.get('choices') or {})}",
                )
            if regex and not re.fullmatch(regex, value):
                return Refused(
                    Reason.BAD_CHOICE,
                    f"{shown(value)} is not a valid {shown(name)}",
                    unlisted.get("validation_message") or f"it must match {regex}",
                )
        elif value not in (option.get("choices") or {}):
            return Refused(
                Reason.BAD_CHOICE,
                f"{shown(value)} is not a choice of option {shown(name)}",
                f"choose one of {', '.join(option.get('choices') or {})}",
            )
    return Choice(profile=profile_slug if isinstance(profile_slug, str) else None, slice=chosen)


# ---- quotas --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """One of the user's other servers that holds (or is starting with) a slice."""

    server: str
    slug: str
    gib: int


def quota_for(per_user: int | None, per_group: Mapping[str, int], groups: Iterable[str]) -> int | None:
    """The user's GiB quota: the largest override among their groups, else the per-user one.

    ``None``: no limit.
    """
    overrides = [per_group[g] for g in groups if g in per_group]
    return max(overrides) if overrides else per_user


def check_quota(wanted: Slice, gib: int, limit: int | None, others: Sequence[Holding]) -> Refused | None:
    """Refuse a spawn that would take the user's concurrent GiB over ``limit``."""
    if limit is None:
        return None
    used = sum(h.gib for h in others)
    if used + gib <= limit:
        return None
    servers = ", ".join(f"{h.server or 'default'!r} ({h.slug}, {h.gib} GiB)" for h in others)
    if others:
        detail = (
            f"over your GPU quota of {limit} GiB: {wanted.slug} needs {gib} GiB and your servers "
            f"{servers} already use {used} GiB"
        )
        room = limit - used
        fix = "stop one of those servers" + (f", or choose a slice of at most {room} GiB" if room > 0 else "")
    else:
        detail = f"{wanted.slug} needs {gib} GiB, more than your GPU quota of {limit} GiB"
        fix = f"choose a slice of at most {limit} GiB, or ask an admin for a larger quota"
    return Refused(Reason.QUOTA, detail, fix)
