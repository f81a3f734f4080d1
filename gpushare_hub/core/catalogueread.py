"""Reading the slice catalogue: ``c.GPUShareSpawner.slices`` and the ``profile_list`` entries
that attach a slice, checked once at start into a :class:`~.catalogue.Catalogue`, or a
:class:`~.catalogue.CatalogueError` naming the entry, the problem and the fix. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpushare_hub.core import DEFAULT_NAMES, ResourceNames, computeshare
from gpushare_hub.core.cards import MODEL_MIB
from gpushare_hub.core.catalogue import (
    ENTRY_KEYS,
    PROFILE_KEY,
    SLICES_TRAIT,
    SLUG_RE,
    Catalogue,
    CatalogueError,
    Slice,
    known_model,
    model_units,
    profile_slug,
)
from gpushare_hub.core.isolation import COOPERATIVE, TIERS


def _where(index: int, entry: Mapping[str, Any]) -> str:
    slug = entry.get("slug")
    return f"{SLICES_TRAIT}[{index}]" + (f" (slug {slug!r})" if isinstance(slug, str) else "")


def _positive_int(value: Any, where: str, key: str, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise CatalogueError(f"{where}: {key!r} is {value!r}; {fix}")
    return value


def _strings(value: Any, where: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise CatalogueError(f'{where}: {key!r} must be a list of names, e.g. ["Tesla-T4"]; got {value!r}')
    return tuple(value)


def read_slice(index: int, entry: Any, names: ResourceNames = DEFAULT_NAMES) -> Slice:
    """One catalogue entry, checked. Raises :class:`CatalogueError`."""
    if not isinstance(entry, Mapping):
        raise CatalogueError(f"{SLICES_TRAIT}[{index}] is a {type(entry).__name__}; each entry is a dict")
    where = _where(index, entry)
    unknown = sorted(set(entry) - ENTRY_KEYS)
    if unknown:
        raise CatalogueError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; an entry has "
            f"{', '.join(sorted(ENTRY_KEYS))} (image, CPU and memory go in an ordinary profile_list "
            f"entry with {PROFILE_KEY!r})"
        )
    slug = entry.get("slug")
    if not isinstance(slug, str) or not SLUG_RE.match(slug):
        raise CatalogueError(
            f"{where}: 'slug' must be lower-case letters, digits and dashes (at most 63), "
            f"like 't4-5g'; got {slug!r}"
        )
    display = entry.get("display_name")
    if not isinstance(display, str) or not display.strip():
        raise CatalogueError(
            f"{where}: 'display_name' is missing; give the text users see, e.g. 'Tesla T4 · 5 GiB'"
        )
    cards = _positive_int(entry.get("cards", 1), where, "cards", "give a whole number of cards >= 1")
    gib = entry.get("gib")
    if gib is not None:
        gib = _positive_int(gib, where, "gib", "give whole GiB >= 1, or leave 'gib' out for whole cards")
    models = _strings(entry.get("models", []), where, "models")
    canonical = []
    for m in models:
        key = known_model(m)
        if key is None:
            raise CatalogueError(
                f"{where}: card model {m!r} is unknown; use one of {', '.join(MODEL_MIB)} "
                "(the names NVML reports, spaces as dashes)"
            )
        canonical.append(key)
        units = model_units(key, names)
        if gib is not None and units is not None and gib > units:
            raise CatalogueError(
                f"{where}: {gib} GiB is more than a {key} holds ({units} GiB); ask for at most "
                f"{units}, drop {key} from 'models', or offer whole cards by leaving 'gib' out"
            )
    description = entry.get("description", "")
    if not isinstance(description, str):
        raise CatalogueError(f"{where}: 'description' must be text; got {description!r}")
    groups = _strings(entry.get("groups", []), where, "groups")
    isolation = entry.get("isolation")
    if isolation is not None and isolation not in TIERS:
        raise CatalogueError(
            f"{where}: 'isolation' is {str(isolation)[:40]!r}, which is not an isolation tier; use one of "
            f"{', '.join(TIERS)} (mps and driver are hard limits), or leave it out for any GPU node"
        )
    found = Slice(
        slug=slug,
        display_name=display,
        gib=gib,
        cards=cards,
        models=tuple(canonical),
        description=description,
        groups=groups,
        default=bool(entry.get("default", False)),
        isolation=None if isolation in (None, COOPERATIVE) else isolation,
    )
    share, problem = computeshare.check(entry.get(computeshare.KEY), found.isolation, found.memory_share)
    if problem is not None:
        raise CatalogueError(f"{where}: {problem}")
    return replace(found, compute_share=share)


def read_catalogue(
    entries: Sequence[Any], profiles: Sequence[Mapping[str, Any]] = (), names: ResourceNames = DEFAULT_NAMES
) -> Catalogue:
    """Check every entry and the ``profile_list`` entries that attach a slice.

    ``profiles`` are the admin's ordinary ``profile_list`` entries (when it is a list
    or dict; a callable one is checked each time it is called).
    """
    slices = [read_slice(i, e, names) for i, e in enumerate(entries)]
    seen: dict[str, int] = {}
    for i, s in enumerate(slices):
        if s.slug in seen:
            raise CatalogueError(
                f"{SLICES_TRAIT}[{i}]: slug {s.slug!r} is already used by {SLICES_TRAIT}[{seen[s.slug]}]; "
                "every slice needs its own slug"
            )
        seen[s.slug] = i
    by_slug = {s.slug: s for s in slices}
    attached = attach(profiles, by_slug)
    return Catalogue(slices=tuple(slices), attached=attached)


def attach(profiles: Sequence[Mapping[str, Any]], slices: Mapping[str, Slice]) -> dict[str, str]:
    """Profile slug -> slice slug for ``profile_list`` entries carrying ``gpushare_slice``.

    Such an entry's slug defaults to the slice's slug, so that ``user_options["profile"]``
    is the slice slug in the usual case of one profile per slice.
    """
    attached: dict[str, str] = {}
    used: dict[str, str] = {}
    for i, p in enumerate(profiles):
        where = f"c.GPUShareSpawner.profile_list[{i}]"
        if not isinstance(p, Mapping):
            raise CatalogueError(f"{where} is a {type(p).__name__}; each profile is a dict")
        target = p.get(PROFILE_KEY)
        slug = profile_slug(p)
        if target is not None:
            if not isinstance(target, str) or target not in slices:
                raise CatalogueError(
                    f"{where}: {PROFILE_KEY}={target!r} names no slice; use one of "
                    f"{', '.join(sorted(slices)) or '(none: define c.GPUShareSpawner.slices first)'}"
                )
            slug = slug or target
            attached[slug] = target
        if slug is not None:
            if slug in used:
                raise CatalogueError(
                    f"{where}: slug {slug!r} is already used by {used[slug]}; give it its own slug"
                )
            if target is None and slug in slices:
                raise CatalogueError(
                    f"{where}: slug {slug!r} is also a slice's slug; rename the profile, or attach the slice "
                    f"with {PROFILE_KEY}: {slug!r}"
                )
            used[slug] = where
    return attached
