"""A slice's share of its card's compute: a percentage of the card's SMs, which MPS provisions.

By default a slice's share is in proportion to its memory (5 GiB of a 15 GiB T4: 34%), so the
shares of a card's slices add up to at most the whole card. An admin may give a slice a smaller
share in the catalogue (``compute_share``: 1 to 100, at most its memory's share), and may turn
shares off on a node (the device plugin's node option ``computeShare: false``: time-sliced).

Where it holds: on MPS nodes the device plugin's Allocate gives each container
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, the share of the SMs its CUDA contexts may use; MPS
provisions them in hardware. Elsewhere a slice is time-sliced and has no share. The spawner tells
the plugin an explicit share through the pod annotation :data:`COMPUTE_SHARE_ANNOTATION`, which
users can also write on their own pods: so the plugin gives the smaller of it and the memory's
share, and a forged annotation can only lower its own pod's share. Pure: no I/O.
"""

from __future__ import annotations

from .digits import ascii_int
from .isolation import DRIVER, MPS
from .names import COMPUTE_SHARE_ANNOTATION

KEY = "compute_share"
MPS_PERCENTAGE_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
NO_SHARE = "time-sliced, no compute share"

__all__ = ["COMPUTE_SHARE_ANNOTATION", "KEY", "MPS_PERCENTAGE_ENV", "NO_SHARE"]


def proportional(units: int, card_units: int) -> int:
    """The share of ``units`` of a card of ``card_units``: its memory's percentage, rounded up."""
    if card_units <= 0:
        return 100
    return max(1, min(100, -(-100 * units // card_units)))


def check(value: object, isolation: str | None, most: int | None) -> tuple[int | None, str | None]:
    """A catalogue entry's ``compute_share``: (the share, None) or (None, the problem and its fix).

    ``most``: the slice's memory's share of its card where the catalogue knows the card (its
    models), else None. Absent: None (in proportion to its memory)."""
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        return None, (
            f"{KEY!r} is {str(value)[:40]!r}; give a percentage of the card's SMs from 1 to 100, or "
            "leave it out for a share in proportion to the slice's memory"
        )
    if isolation == DRIVER:
        return None, (
            f"{KEY!r} is {value}, but only MPS holds a compute share and the slice requires isolation "
            f"'driver', whose nodes cannot enforce one; require isolation {MPS!r}, or leave {KEY!r} out"
        )
    if most is not None and value > most:
        return None, (
            f"{KEY!r} is {value}, more than the slice's memory's share of its card ({most}%), the "
            f"most a slice gets so that a card's shares add up to at most the card; give at most {most}"
        )
    return value, None


def from_annotation(raw: str | None, units: int, card_units: int) -> int:
    """What Allocate gives a container on an MPS node: the pod's annotation when it is a share
    from 1 to 100 and smaller than its memory's share, else its memory's share."""
    memory = proportional(units, card_units)
    asked = ascii_int((raw or "").strip(), 3)
    if asked is not None and 1 <= asked <= 100:
        return min(asked, memory)
    return memory


def in_force(explicit: int | None, units: int, card_units: int, tier: str | None) -> dict[str, object]:
    """A held slice's share as the API says it: ``share`` (percent of the card's SMs, None where
    the node's tier is not MPS: time-sliced) and ``words``."""
    if tier != MPS:
        return {"share": None, "words": NO_SHARE}
    share = from_annotation(None if explicit is None else str(explicit), units, card_units)
    return {"share": share, "words": f"{share}% of the card's SMs (MPS)"}


def words(share: int | None, most: int | None, isolation: str | None) -> str:
    """What the spawn form says of a slice's compute."""
    if share is not None:
        amount = f"{share}% of the card's SMs"
    elif most is not None:
        amount = f"{most}% of the card's SMs"
    else:
        amount = "a share of the SMs in proportion to its memory"
    if isolation == MPS:
        return f"compute: {amount} (MPS)"
    if isolation == DRIVER:
        return f"compute: {NO_SHARE}"
    return f"compute: {amount} on MPS nodes, else time-sliced"
