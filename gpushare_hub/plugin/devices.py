"""Cards to the fake devices the kubelet counts, and back (pure).

Each unit of GPU memory on a card is one fake device whose ID is the card UUID
plus the unit number, ``GPU-8f2c...-_-3``, the format Aliyun's plugin uses: so
any device ID names its card, and a T4 (15 GiB units) is 15 devices, whatever
the node's size, far below the kubelet's 4 MB message limit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpushare_hub.core.cards import Card

SEPARATOR = "-_-"
MAX_ID = 63  # the kubelet rejects longer device IDs


def units_of(mib: int, mib_per_unit: int, reserve_fraction: float = 0.0) -> int:
    """Units a card offers after keeping ``reserve_fraction`` of it back (gpu-manager's
    deviceMemoryScaling, inverted): 15360 MiB, GiB units, no reserve -> 15."""
    if not 0.0 <= reserve_fraction < 1.0:
        raise ValueError(f"reserve fraction must be in [0, 1), got {reserve_fraction}")
    return int(mib * (1.0 - reserve_fraction)) // mib_per_unit


def device_ids(card: Card) -> list[str]:
    ids = [f"{card.uuid}{SEPARATOR}{n}" for n in range(card.units)]
    if ids and len(ids[-1]) > MAX_ID:
        raise ValueError(f"card UUID {card.uuid!r} makes device IDs longer than {MAX_ID} characters")
    return ids


def card_of(device_id: str) -> str:
    """The card UUID inside a device ID."""
    uuid, sep, n = device_id.rpartition(SEPARATOR)
    if not sep or not uuid or not n.isdigit():
        raise ValueError(f"{device_id!r} is not a gpushare device ID (<card UUID>{SEPARATOR}<n>)")
    return uuid


def by_card(ids: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for i in ids:
        out.setdefault(card_of(i), []).append(i)
    return out


def preferred(
    available: Sequence[str], must_include: Sequence[str], size: int, cards: str | Sequence[str] | None
) -> list[str]:
    """``size`` device IDs from ``cards`` where possible, split over them as the extender split
    the container's units (then the must-includes); with no cards, all from one card."""
    chosen = list(dict.fromkeys(must_include))[:size]
    pool = [i for i in available if i not in chosen]
    wanted = (cards,) if isinstance(cards, str) else tuple(cards or ())
    if wanted:
        rank = {u: n for n, u in enumerate(wanted)}
        share = {u: size // len(wanted) + (n < size % len(wanted)) for n, u in enumerate(wanted)}
        for i in chosen:
            share[card_of(i)] = share.get(card_of(i), 0) - 1
        picked = []
        for i in sorted(pool, key=lambda i: (rank.get(card_of(i), len(rank)), i)):
            if share.get(card_of(i), 0) > 0:
                share[card_of(i)] -= 1
                picked.append(i)
        rest = [i for i in pool if i not in set(picked)]
        pool = picked + sorted(rest, key=lambda i: (card_of(i) not in rank, i))
    else:  # keep a container's units on one card: fullest group of available IDs first
        groups = by_card(pool)
        pool.sort(key=lambda i: (-len(groups[card_of(i)]), card_of(i), i))
    return chosen + pool[: size - len(chosen)]
