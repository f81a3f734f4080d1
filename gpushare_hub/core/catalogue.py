"""The slice catalogue: what an admin offers, read and checked once from configuration.

An admin writes ``c.GPUShareSpawner.slices`` as a list of plain dicts (see the
trait's help). :func:`~.catalogueread.read_catalogue` turns them into :class:`Slice` values, or
raises :class:`CatalogueError` naming the entry, the problem and the fix, so a
wrong catalogue stops the hub at start instead of failing a user's spawn later.

Card sizes come from the core's table of card models
(:data:`gpushare_hub.core.cards.MODEL_MIB`), the same one the simulated device
plugin and the replayer use. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_hub.core import DEFAULT_NAMES, Demand, GPUShareError, ResourceNames, cardmemory, computeshare
from gpushare_hub.core.cards import MODEL_MIB
from gpushare_hub.core.declarations import known_mib
from gpushare_hub.core.isolation import COOPERATIVE, WORDS

SLICES_TRAIT = "c.GPUShareSpawner.slices"
PROFILE_KEY = "gpushare_slice"  # in an ordinary profile_list entry: the slice it runs on
SLUG_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
ENTRY_KEYS = frozenset(
    {
        "slug",
        "display_name",
        "gib",
        "cards",
        "models",
        "description",
        "groups",
        "default",
        "isolation",
        "compute_share",
    }
)


class CatalogueError(GPUShareError, ValueError):
    """The configured catalogue is wrong; the message names the entry and the fix."""


@dataclass(frozen=True)
class Slice:
    """One offer of the catalogue.

    ``gib`` per card, or ``None`` for whole cards; ``cards`` how many cards (on one
    node). ``models``: the card models it may run on (empty: any). ``groups``: the
    hub groups whose members may use it (empty: every user).
    """

    slug: str
    display_name: str
    gib: int | None
    cards: int = 1
    models: tuple[str, ...] = ()
    description: str = ""
    groups: tuple[str, ...] = ()
    default: bool = False
    isolation: str | None = None  # the tier the slice requires (None: any node)
    compute_share: int | None = None  # percent of the card's SMs on MPS nodes (None: its memory's)

    @property
    def limit_words(self) -> str:
        """What holds the slice, in a user's words: ``"hard limit per process by MPS"`` or
        ``"cooperative limit for the whole server"``."""
        return WORDS[self.isolation or COOPERATIVE]

    @property
    def memory_share(self) -> int | None:
        """Its memory's percentage of its card where the catalogue knows the card (one size of
        model), else None; whole cards: 100."""
        if self.gib is None:
            return 100
        sizes = {MODEL_MIB[m] for m in self.models}
        if len(sizes) != 1:
            return None
        return computeshare.proportional(self.gib * 1024, sizes.pop())

    @property
    def compute_words(self) -> str:
        """What the form says of its compute (``compute: 34% of the card's SMs on MPS nodes, ...``)."""
        return computeshare.words(self.compute_share, self.memory_share, self.isolation)

    @property
    def usable_words(self) -> str:
        """What the form says PyTorch gets of it (``PyTorch gets about 4.4 GiB of it ...``)."""
        sizes = {MODEL_MIB[m] for m in self.models}
        if len(sizes) == 1:
            return cardmemory.words(self.gib, self.models[0], sizes.pop())
        return cardmemory.words(self.gib, None, None)

    @property
    def whole(self) -> bool:
        return self.gib is None

    def demand(self, key: str = "") -> Demand:
        """What the pod of this slice asks the placement core for."""
        return Demand(
            key=key or f"slice/{self.slug}",
            per_card=self.gib,
            count=self.cards,
            models=self.models,
            isolation=self.isolation,
        )

    def quota_gib(self, names: ResourceNames = DEFAULT_NAMES) -> int:
        """GiB this slice counts against a quota; a whole card counts as its largest allowed model."""
        if self.gib is not None:
            return self.gib * self.cards
        sizes = [u for m in (self.models or tuple(MODEL_MIB)) if (u := model_units(m, names)) is not None]
        return self.cards * max(sizes, default=0)

    def describe(self) -> str:
        """``"5 GiB of a Tesla-T4"`` / ``"2 whole Tesla-T4 cards"``: the amount, for messages."""
        models = "/".join(self.models) or "GPU"
        if self.gib is None:
            return f"{self.cards} whole {models} card{'s' if self.cards != 1 else ''}"
        if self.cards == 1:
            return f"{self.gib} GiB of a {models}"
        return f"{self.gib} GiB on each of {self.cards} {models} cards"

    def allows(self, groups: Iterable[str]) -> bool:
        return not self.groups or bool(set(self.groups) & set(groups))


def known_model(name: str) -> str | None:
    """The core table's spelling of a card model (case and spaces ignored), or ``None``."""
    found = known_mib(name)
    return None if found is None else found[0]


def model_units(name: str, names: ResourceNames = DEFAULT_NAMES) -> int | None:
    key = known_model(name)
    return None if key is None else names.units_from_mib(MODEL_MIB[key])


@dataclass(frozen=True)
class Catalogue:
    """The checked slices, and which ordinary profile (by slug) runs on which slice."""

    slices: tuple[Slice, ...]
    attached: Mapping[str, str]  # profile slug -> slice slug

    def get(self, slug: str) -> Slice | None:
        for s in self.slices:
            if s.slug == slug:
                return s
        return None

    def for_profile(self, profile_slug: str) -> Slice | None:
        """The slice a profile runs on: a catalogue slice itself, or one attached to a profile."""
        slug = self.attached.get(profile_slug, profile_slug)
        return self.get(slug)

    def groups(self) -> set[str]:
        return {g for s in self.slices for g in s.groups}

    def unknown_groups(self, existing: Iterable[str]) -> list[str]:
        """Messages for entries naming groups the hub does not have (empty: all good)."""
        have = set(existing)
        out = []
        for i, s in enumerate(self.slices):
            missing = sorted(set(s.groups) - have)
            if missing:
                out.append(
                    f"{SLICES_TRAIT}[{i}] (slug {s.slug!r}): group(s) {', '.join(map(repr, missing))} "
                    "do not exist in the hub; create them (c.JupyterHub.load_groups or the admin page) "
                    "or fix the spelling"
                )
        return out


def profile_slug(profile: Mapping[str, Any]) -> str | None:
    slug = profile.get("slug")
    return slug if isinstance(slug, str) else None
