"""The ``--cards`` value of ``gpushare-demo``: how many cards of which model each node has. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpushare_hub.core import DEFAULT_NAMES, GPUShareError
from gpushare_hub.core.cards import MODEL_MIB
from gpushare_hub.core.catalogue import known_model

CARDS_FORM = '"COUNTx MODEL", e.g. --cards "2x Tesla T4"'
_CARDS_RE = re.compile(r"^\s*(\d+)\s*[xX×]\s*(\S.*?)\s*$")
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
    """``"2x Tesla T4"`` -> 2 cards of 15360 MiB; a malformed or unknown value raises :class:`CardsError`."""
    m = _CARDS_RE.match(text)
    if not m:
        raise CardsError(f"--cards {text!r} is not of the form {CARDS_FORM}")
    count, model = int(m.group(1)), " ".join(m.group(2).split())
    if not 1 <= count <= MAX_CARDS:
        raise CardsError(f"--cards {text!r}: COUNT must be 1 to {MAX_CARDS}; the form is {CARDS_FORM}")
    key = known_model(model)
    if key is None:
        known = ", ".join(sorted({k.replace("-", " ") for k in MODEL_MIB}))
        raise CardsError(f"--cards {text!r}: unknown card model {model!r}; known models: {known}")
    return DemoCards(count=count, model=model, mib=MODEL_MIB[key])
