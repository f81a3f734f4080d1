"""What of a slice its frameworks can hold: a card's memory as CUDA gives it, and each process's context.

Two things sit between a "5 GiB" slice and 5 GiB in PyTorch (issue 47):

* **The driver's reserve.** NVML reports more than CUDA can give: a Tesla T4 is 15360 MiB to NVML
  and 15110 MiB to CUDA. The device plugin sells a card by NVML's size in GiB units (a T4: 15), so
  a card sold out as 5 + 5 + 5 GiB has 15110 MiB to share, not 15360: each slice gets its part of
  CUDA's memory, :func:`usable_mib` (a third: 5036 MiB).
* **Each process's CUDA context.** Every GPU process holds memory outside its framework's
  allocator (the context, loaded modules, library workspaces): on an H200 a 3 GiB PyTorch tensor
  showed as 3.51 GiB in ``nvidia-smi``. The start-up hook counts :data:`CONTEXT_MIB` per GPU
  process in the container ledger, so a slice's processes together, contexts included, stay
  inside its part of the card.

So a 5 GiB slice of a T4 gives its one PyTorch process 5036 - 560 = 4476 MiB (about 4.4 GiB,
:func:`framework_mib`), and three such notebooks on one card can each hold that at once without
a raw CUDA out-of-memory error. Allocate tells the hook both figures (``GPUSHARE_CARD_CUDA_MIB``,
``GPUSHARE_CONTEXT_MIB``); the spawn form says what PyTorch gets (:func:`words`). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from .cards import Card
from .declarations import known_mib

# NVML's MiB less CUDA's, per model (the table's spelling, core/cards.py MODEL_MIB): measured.
CUDA_RESERVE_MIB: dict[str, int] = {
    "Tesla-T4": 250,  # 15360 to NVML, 15110 to CUDA (issue 47)
    "T4": 250,
    "NVIDIA-H200": 616,  # 143771 to NVML, 143155 to CUDA (the checkpoint measurement, 2026-11-28)
    "H200": 616,
}
# Other models: more than any measured (T4 1.6 %, H200 0.4 %), so that a slice is never promised
# memory CUDA does not have.
DEFAULT_RESERVE_FRACTION = 0.02
# Each GPU process's memory outside its framework's allocator: 522 MiB measured for PyTorch on an
# H200 (a 3 GiB tensor showed as 3.51 GiB), with room to spare; the plugin's node option
# ``contextMiB`` sets another.
CONTEXT_MIB = 560
MAX_CONTEXT_MIB = 8192
CARD_CUDA_ENV = "GPUSHARE_CARD_CUDA_MIB"
CONTEXT_ENV = "GPUSHARE_CONTEXT_MIB"


def cuda_mib(model: str, nvml_mib: int) -> int:
    """The card's memory as CUDA gives it: NVML's less the model's reserve (measured, else 2 %)."""
    found = known_mib(model, {name: None for name in CUDA_RESERVE_MIB})
    if found is not None:
        return max(0, nvml_mib - CUDA_RESERVE_MIB[found[0]])
    return int(nvml_mib * (1.0 - DEFAULT_RESERVE_FRACTION))


def usable_mib(slice_mib: int, card_mib: int, card_cuda_mib: int) -> int:
    """A slice's part of what CUDA gives of its card, its processes' contexts included: the slice
    scaled from NVML's size to CUDA's (never more than the slice)."""
    if card_mib <= 0 or card_cuda_mib <= 0 or card_cuda_mib >= card_mib:
        return slice_mib
    return slice_mib * card_cuda_mib // card_mib


def framework_mib(slice_mib: int, model: str, card_mib: int, context_mib: int = CONTEXT_MIB) -> int:
    """What one process's framework may hold of a slice, alone in it: its part of CUDA's memory
    less the process's context."""
    return max(0, usable_mib(slice_mib, card_mib, cuda_mib(model, card_mib)) - context_mib)


def words(gib: int | None, model: str | None, card_mib: int | None) -> str:
    """What the spawn form says a slice's PyTorch gets: ``PyTorch gets about 4.4 GiB of it`` where
    the card is known, else how the slice is counted; nothing for whole cards."""
    if gib is None:
        return ""  # whole cards: the card is the user's
    context_gib = f"{CONTEXT_MIB / 1024:.2f}".rstrip("0").rstrip(".")
    if model is None or not card_mib:
        return (
            f"PyTorch gets the slice less the card's driver reserve and about {context_gib} GiB per "
            "GPU process for its CUDA context"
        )
    got = framework_mib(gib * 1024, model, card_mib) / 1024
    return f"PyTorch gets about {int(got * 10) / 10:.1f} GiB of it (the rest holds the CUDA context)"


def sell_problem(
    node: str, cards: Sequence[Card], reserve_fraction: float, mib_per_unit: int, context_mib: int
) -> str | None:
    """Why a node's device plugin cannot sell its cards as set, naming the node and the fix, or None:
    a reserve that leaves a card no unit, or a context allowance that leaves a one-unit slice's
    framework nothing."""
    for card in cards:
        if card.units < 1:
            most = max(0.0, 1.0 - mib_per_unit / card.mib) if card.mib else 0.0
            return (
                f"node {node}: card {card.index} ({card.model}, {card.mib} MiB) keeps no slice to sell "
                f"with reserveFraction {reserve_fraction:g} (not even {mib_per_unit} MiB is left); "
                f"lower reserveFraction in the node's options to at most {int(most * 100) / 100:g}"
            )
    if not 0 <= context_mib <= MAX_CONTEXT_MIB:
        return (
            f"node {node}: contextMiB {context_mib} is outside 0 to {MAX_CONTEXT_MIB}; give the MiB a "
            f"CUDA context takes, e.g. {CONTEXT_MIB}"
        )
    smallest = min(
        (usable_mib(mib_per_unit, c.mib, cuda_mib(c.model, c.mib)) for c in cards if c.mib), default=None
    )
    if smallest is not None and context_mib >= smallest:
        return (
            f"node {node}: contextMiB {context_mib} leaves a slice of one unit ({mib_per_unit} MiB, "
            f"{smallest} MiB as CUDA gives it) nothing for its framework; give less than {smallest}, "
            f"e.g. {CONTEXT_MIB}"
        )
    return None
