"""Names and units of the extended resources, and quantity parsing.

The schedulable resource is GPU memory counted in whole *units* (GiB by default,
as Aliyun gpushare does): a card reporting 15360 MiB through NVML has
``15360 // 1024 = 15`` units. All arithmetic in the core is on integer units.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from kubernetes.utils.quantity import parse_quantity

from .errors import InvalidQuantity

MIB_PER_UNIT = {"GiB": 1024, "MiB": 1}
# Units that are shares of a card rather than memory (the trace replayer's).
SHARE_UNITS = {"slices": "slices", "milli": "milli-GPU"}


@dataclass(frozen=True)
class ResourceNames:
    """Which extended resources we schedule and in what unit.

    memory: the per-pod GPU-memory resource (``aliyun.com/gpu-mem``).
    count: the number-of-cards resource (``aliyun.com/gpu-count``); a pod that asks
        for it wants that many distinct cards on one node.
    unit: ``GiB`` (default) or ``MiB``; the size of one unit of ``memory``.
    """

    memory: str = "aliyun.com/gpu-mem"
    count: str = "aliyun.com/gpu-count"
    unit: str = "GiB"

    def __post_init__(self) -> None:
        if self.unit not in MIB_PER_UNIT and self.unit not in SHARE_UNITS:
            raise ValueError(f"unit {self.unit!r} is not one of {sorted(MIB_PER_UNIT)}")

    @property
    def mib_per_unit(self) -> int:
        if self.unit not in MIB_PER_UNIT:
            raise ValueError(f"unit {self.unit!r} is a share of a card, not an amount of memory")
        return MIB_PER_UNIT[self.unit]

    def units_from_mib(self, mib: int) -> int:
        """Whole units a card of ``mib`` MiB offers (rounded down, as gpushare does)."""
        return mib // self.mib_per_unit

    def fmt(self, units: int) -> str:
        """``5`` -> ``"5 GiB"``: how amounts appear in messages."""
        return f"{units} {SHARE_UNITS.get(self.unit, self.unit)}"


DEFAULT_NAMES = ResourceNames()


def parse_units(value: object, *, what: str) -> int:
    """Parse a Kubernetes quantity that must be a whole, non-negative number of units.

    ``what`` names where the value came from (pod, container, resource) for the error.
    Uses the Kubernetes client's own parser, so ``"5"``, ``5`` and ``"5000m"`` agree.
    """
    try:
        q: Decimal = parse_quantity(value)
    except (ValueError, TypeError) as err:
        raise InvalidQuantity(f"{what}: {value!r} is not a Kubernetes quantity ({err})") from err
    if not q.is_finite():
        raise InvalidQuantity(f"{what}: {value!r} is not a finite number; ask for a whole number of units")
    if q < 0:
        raise InvalidQuantity(f"{what}: {value!r} is negative; ask for a whole number of units >= 0")
    if q != q.to_integral_value():
        raise InvalidQuantity(
            f"{what}: {value!r} is not a whole number; extended resources are counted in whole units"
        )
    return int(q)
