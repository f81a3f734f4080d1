"""Lower bounds on the number of cards a set of items needs (one-dimensional bin packing).

Items are integer sizes in ``1..capacity``. Work is done on a size histogram, so
each bound costs O(capacity²) however many items there are: cheap enough to
evaluate at every arrival and departure of a replay.
"""

from __future__ import annotations

from collections.abc import Mapping


def _check(hist: Mapping[int, int], capacity: int) -> None:
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    for s, n in hist.items():
        if n and not 0 < s <= capacity:
            raise ValueError(f"item size {s} outside 1..{capacity}")


def l1(hist: Mapping[int, int], capacity: int) -> int:
    """ceil(total size / capacity)."""
    _check(hist, capacity)
    total = sum(s * n for s, n in hist.items())
    return -(-total // capacity)


def l2(hist: Mapping[int, int], capacity: int) -> int:
    """Martello and Toth's L2 bound (1990), which dominates L1.

    For each k in 0..C/2: items larger than C-k each need their own card (J1);
    items in (C/2, C-k] each need their own card too (J2) and leave room that only
    items of size >= k could use; items in [k, C/2] (J3) must fit in that room or
    in further cards. L2 is the best of these counts over k.
    """
    _check(hist, capacity)
    c = capacity
    # counts[s] and prefix sums over sizes for O(1) range queries
    counts = [0] * (c + 1)
    for s, n in hist.items():
        counts[s] += n
    cnt_prefix = [0] * (c + 2)
    sum_prefix = [0] * (c + 2)
    for s in range(1, c + 1):
        cnt_prefix[s] = cnt_prefix[s - 1] + counts[s]
        sum_prefix[s] = sum_prefix[s - 1] + counts[s] * s

    def cnt(lo: int, hi: int) -> int:  # sizes in [lo, hi]
        if hi < lo:
            return 0
        return cnt_prefix[hi] - cnt_prefix[max(lo, 1) - 1]

    def tot(lo: int, hi: int) -> int:
        if hi < lo:
            return 0
        return sum_prefix[hi] - sum_prefix[max(lo, 1) - 1]

    half = c // 2
    best = l1(hist, capacity) if any(hist.values()) else 0
    for k in range(0, half + 1):
        j1 = cnt(c - k + 1, c)
        j2_lo = half + 1  # sizes > C/2
        j2_n = cnt(j2_lo, c - k)
        j2_sum = tot(j2_lo, c - k)
        j3_sum = tot(max(k, 1), half)
        room = j2_n * c - j2_sum
        extra = max(0, -(-(j3_sum - room) // c))
        best = max(best, j1 + j2_n + extra)
    return best
