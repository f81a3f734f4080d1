"""The ``--cards`` value of ``gpushare-demo``: how many cards of which model each node has. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from gpushare_hub.core import DEFAULT_NAMES, GPUShareError
from gpushare_hub.core.declarations import DeclarationError, parse_card_groups

MAX_CARDS = 8


class CardsError(GPUShareError, ValueError):
    """A malformed ``--cards`` value; the message says the expected form."""


@dataclass(frozen=True)
class DemoCards:
    """``count`` simulated cards of ``model`` (NVML's spelling, e.g. ``Tesla T4``) per node."""

    count: int
    model: str
    mib: int

    @property
    def gib(self) -> int:
        """Whole GiB of one card: what the device plugin advertises (15 for a T4's 15360 MiB)."""
        return DEFAULT_NAMES.units_from_mib(self.mib)


def parse_cards(text: str) -> DemoCards:
    """``"2x Tesla T4"`` -> 2 cards of 15360 MiB; a malformed or unknown value raises :class:`CardsError`.

    The grammar is the core's one card declaration (:mod:`gpushare_hub.core.declarations`), one group."""
    try:
        (group,) = parse_card_groups(text, flag="--cards", max_count=MAX_CARDS, single=True)
    except DeclarationError as err:
        raise CardsError(str(err)) from err
    return DemoCards(count=group.count, model=group.model, mib=group.size)
