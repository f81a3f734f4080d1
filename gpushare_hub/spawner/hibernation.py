"""Room for a hibernating kernel's copy: the memory limit of a slice's pod when its notebook
server may hibernate idle kernels (``GPUShareSpawner.gpu_hibernation``). Pure: no I/O.

Where the hub service's idle action is ``hibernate``, the notebook server's extension
checkpoints each kernel that ran nothing for a while: CUDA copies the kernel's GPU memory into
the pod's host memory, and that copy counts against the pod's memory limit. So a slice's pod
needs its slice (GiB per card × cards; a whole card: the largest card it may get) besides what
the notebook needs otherwise (``gpu_hibernation_base_memory``). A pod without a memory limit
gets exactly that (never less than its memory guarantee: a request may not exceed its limit);
an admin's smaller limit, the spawner's ``mem_limit`` or a profile's ``kubespawner_override``,
stops the hub at start (:func:`check_hibernation`), naming the profile, its limit and the
smallest one that works. Byte sizes are read as KubeSpawner reads ``mem_limit``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jupyterhub.traitlets import ByteSpecification  # type: ignore[import-untyped]
from traitlets import TraitError

from gpushare_hub.core import DEFAULT_NAMES, ResourceNames
from gpushare_hub.core.catalogue import PROFILE_KEY, Catalogue, CatalogueError, Slice

GIB = 1024**3
HIBERNATION_TRAIT = "c.GPUShareSpawner.gpu_hibernation"
BASE_TRAIT = "gpu_hibernation_base_memory"
BASE_DEFAULT = "2G"  # the server and the kernels' own host memory, besides their GPU copies
SPAWNER_LIMIT = "c.GPUShareSpawner.mem_limit"
_UNITS = (("T", 1024**4), ("G", GIB), ("M", 1024**2), ("K", 1024))


def read_bytes(value: Any, where: str) -> int | None:
    """A byte size as ``mem_limit`` takes it (bytes, or ``"8G"``, ``"512M"``: units of 1024),
    read by JupyterHub's own trait type; None stays None. :class:`CatalogueError` naming
    ``where`` for anything else."""
    if value is None:
        return None
    try:
        return int(ByteSpecification().validate(None, value))
    except (TraitError, TypeError, ValueError, IndexError):
        raise CatalogueError(
            f"{where} is {value!r}: write a number of bytes or a size such as '8G' or '512M'"
        ) from None


def byte_words(n: int) -> str:
    """``"7G"``, ``"7680M"``: a byte size as ``mem_limit`` is written, in the largest unit that
    holds it whole."""
    for suffix, size in _UNITS:
        if n >= size and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def copy_bytes(s: Slice, names: ResourceNames = DEFAULT_NAMES) -> int:
    """The most a kernel of ``s`` copies to host memory: its GiB on all its cards."""
    return s.quota_gib(names) * GIB


def memory_needed(s: Slice, base: int, names: ResourceNames = DEFAULT_NAMES) -> int:
    """The smallest memory limit a pod of ``s`` may hibernate in: its copy and ``base``."""
    return copy_bytes(s, names) + base


def pod_limit(s: Slice, base: int, guarantee: int | None, names: ResourceNames = DEFAULT_NAMES) -> int:
    """The memory limit a pod of ``s`` gets where none is set: what it needs, and never less
    than its memory guarantee."""
    return max(memory_needed(s, base, names), guarantee or 0)


@dataclass(frozen=True)
class Offer:
    """A profile of the spawn form that runs on a slice, and the memory limit its pods get
    (None: none set, or one a callable decides at spawn)."""

    display_name: str
    slug: str
    slice: Slice
    mem_limit: int | None
    source: str  # where the limit is set, for the message


def too_small(offer: Offer, base: int, names: ResourceNames = DEFAULT_NAMES) -> str | None:
    """What is wrong with ``offer``'s limit for hibernation (None: it is large enough or unset)."""
    if offer.mem_limit is None:
        return None
    need = memory_needed(offer.slice, base, names)
    if offer.mem_limit >= need:
        return None
    return (
        f"profile {offer.display_name!r} (slug {offer.slug!r}) has mem_limit "
        f"{byte_words(offer.mem_limit)} ({offer.source}), less than the {byte_words(need)} its "
        f"hibernating kernels need ({offer.slice.quota_gib(names)} GiB of GPU memory copied into "
        f"host memory, and {BASE_TRAIT} {byte_words(base)}); raise that mem_limit to at least "
        f"{byte_words(need)}, or turn gpu_hibernation off"
    )


def _override_limit(override: Any, where: str) -> int | None:
    """``mem_limit`` of a ``kubespawner_override`` (None: not set there, or a callable)."""
    if not isinstance(override, Mapping) or callable(override.get("mem_limit")):
        return None
    return read_bytes(override.get("mem_limit"), f"{where} kubespawner_override mem_limit")


def offers(catalogue: Catalogue, profiles: Sequence[Mapping[str, Any]], mem_limit: int | None) -> list[Offer]:
    """Every way the form offers a slice, with the pod's memory limit: each ``profile_list``
    entry running on a slice (its ``kubespawner_override``'s limit, else ``mem_limit``), each of
    its listed choices that sets a limit of its own, and each slice shown as itself."""
    out = []
    for p in profiles:
        slug = p.get("slug") or p.get(PROFILE_KEY)
        s = catalogue.for_profile(slug) if isinstance(slug, str) else None
        if s is None or not isinstance(slug, str):
            continue
        name = str(p.get("display_name", slug))
        where = f"profile {name!r}"
        own = _override_limit(p.get("kubespawner_override"), where)
        limit, source = (own, "its kubespawner_override") if own is not None else (mem_limit, SPAWNER_LIMIT)
        out.append(Offer(name, slug, s, limit, source))
        for option_name, option in (p.get("profile_options") or {}).items():
            option = option or {}
            for choice_name, choice in (option.get("choices") or {}).items():
                choice = choice or {}
                shown_as = (
                    f"{option.get('display_name', option_name)}: {choice.get('display_name', choice_name)}"
                )
                chosen = f"{name}, {shown_as}"
                limit = _override_limit(choice.get("kubespawner_override"), f"profile {chosen!r}")
                if limit is not None:
                    out.append(Offer(chosen, slug, s, limit, "the choice's kubespawner_override"))
    shown = set(catalogue.attached.values())
    out += [
        Offer(s.display_name, s.slug, s, mem_limit, SPAWNER_LIMIT)
        for s in catalogue.slices
        if s.slug not in shown
    ]
    return out


def check_hibernation(
    catalogue: Catalogue,
    profiles: Sequence[Mapping[str, Any]],
    mem_limit: int | None,
    base: int,
    names: ResourceNames = DEFAULT_NAMES,
) -> None:
    """Raise :class:`CatalogueError` naming every offer whose memory limit is too small for its
    kernels' copies (the hub stops at start)."""
    problems = [p for o in offers(catalogue, profiles, mem_limit) if (p := too_small(o, base, names))]
    if problems:
        raise CatalogueError(f"{HIBERNATION_TRAIT} is on, but " + "; ".join(problems))
