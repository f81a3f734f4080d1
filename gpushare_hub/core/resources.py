"""Names and units of the extended resources, and Kubernetes quantity parsing.

The schedulable resource is GPU memory counted in whole *units* (GiB by default,
as Aliyun gpushare does): a card reporting 15360 MiB through NVML has
``15360 // 1024 = 15`` units. All arithmetic in the core is on integer units.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation, localcontext

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


# apimachinery's quantity grammar (k8s.io/apimachinery/pkg/api/resource): a signed decimal number
# and one suffix, binary SI (Ki..Ei), decimal SI (n..E) or a decimal exponent (e3, E-2).
_QUANTITY = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)
_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
# Kubernetes keeps quantities in an int64 where it can; nothing we count comes near it, and a bound
# keeps a hostile "1e999999999" from becoming a billion-digit integer.
MAX_QUANTITY = Decimal(2**63 - 1)
_MAX_TEXT = 64


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes quantity (``"5"``, ``5``, ``"5000m"``, ``"1Ki"``, ``"2e3"``) as a Decimal.

    Raises :class:`ValueError` naming what is wrong. Booleans are not quantities."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a quantity")
    if isinstance(value, int | Decimal):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if not isinstance(value, str):
        raise ValueError(f"a {type(value).__name__} is not a quantity")
    if len(value) > _MAX_TEXT:
        raise ValueError(f"longer than {_MAX_TEXT} characters")
    m = _QUANTITY.fullmatch(value)
    if m is None:
        raise ValueError("not a number with an optional suffix (Ki, Mi, Gi, m, k, M, G, e3, ...)")
    # Exact arithmetic: 28 digits (Decimal's default) would round 1.0000…0001 to a whole number.
    with localcontext(prec=100):
        return _scaled(m[1], m[2] or "")


def _scaled(digits: str, suffix: str) -> Decimal:
    try:
        number = Decimal(digits)
        if suffix in _BINARY:
            return number * Decimal(1024) ** _BINARY[suffix]
        exponent = _DECIMAL[suffix] if suffix in _DECIMAL else int(suffix[1:] or 0)
        if abs(exponent) > 100:
            raise ValueError(f"exponent {exponent} is out of range")
        return number.scaleb(exponent)
    except InvalidOperation as err:
        raise ValueError(f"cannot be read as a number ({err})") from err


def parse_units(value: object, *, what: str) -> int:
    """Parse a Kubernetes quantity that must be a whole, non-negative number of units.

    ``what`` names where the value came from (pod, container, resource) for the error.
    Follows apimachinery's grammar, so ``"5"``, ``5`` and ``"5000m"`` agree.
    """
    try:
        q = parse_quantity(value)
    except ValueError as err:
        raise InvalidQuantity(f"{what}: {value!r} is not a Kubernetes quantity ({err})") from err
    if not q.is_finite():
        raise InvalidQuantity(f"{what}: {value!r} is not a finite number; ask for a whole number of units")
    if q < 0:
        raise InvalidQuantity(f"{what}: {value!r} is negative; ask for a whole number of units >= 0")
    if q > MAX_QUANTITY:
        raise InvalidQuantity(f"{what}: {value!r} is larger than any quantity Kubernetes counts")
    if q != q.to_integral_value():
        raise InvalidQuantity(
            f"{what}: {value!r} is not a whole number; extended resources are counted in whole units"
        )
    return int(q)
