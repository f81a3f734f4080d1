"""Reading a ResourceClaim (``resource.k8s.io/v1``) into the ledger's :class:`~.records.Allocation`.

On the DRA path the default scheduler, not our extender, decides which card a notebook gets: it
writes the claim's ``status.allocation`` (one result per device, with the bytes it took of the
card's consumable ``memory`` capacity) and ``status.reservedFor`` (the pod) through the status
subresource. That status is as untrusted as an annotation: :func:`read_claim` checks the fields
the ledger reads (raising :class:`~.errors.InvalidObject` naming the first wrong one) and
:func:`claim_reading` applies the rule of :mod:`.records` to it. A claim counts when:

* some result names our driver (:data:`~.names.DRA_DRIVER`); a claim of other drivers only holds
  nothing (read, never reported);
* all our results name one pool, which is the node's name, and the node is known;
* each device is ``gpu-<index>`` of a card the node's inventory annotation lists;
* each result's ``consumedCapacity.memory`` is a whole, positive number of bytes, counted in the
  ledger's unit rounded up (absent: the device was allocated whole, as a cluster without
  DRAConsumableCapacity does, and the claim holds the whole card);
* together with what is already counted, no card holds more than it has (the ledger checks it).

Whom the units are counted for: the first pod of ``status.reservedFor``, under the pod's own key
(``namespace/name``; a claim reserved for several pods is reported, :func:`shared`), so that
everything that joins allocations to pods (the dashboard's hub user, idle return, budgets) joins
a claim's the same way. A claim allocated but not yet reserved
holds its units under :func:`claim_key` (``namespace/resourceclaim:name``: never a pod's key).
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .annotations import CardShare
from .cards import Node
from .digits import ascii_int
from .errors import InvalidObject
from .names import DRA_CAPACITY, DRA_DEVICE_CLASS, DRA_DEVICE_PREFIX, DRA_DRIVER
from .records import Allocation, Ignored, IgnoredRecord
from .resources import DEFAULT_NAMES, MAX_QUANTITY, ResourceNames, parse_quantity
from .shapes import MAX_NAME, described

MAX_RESULTS = 256  # the API server's bound on a claim's device results (32 per request, 8 requests)
MAX_RESERVED = 256  # ResourceClaimReservedForMaxSize
MAX_REQUESTS = 32  # DeviceRequestsMaxSize
MAX_SUBREQUESTS = 8  # FirstAvailableDeviceRequestMaxSize
MAX_BYTES = 2**50  # 1 PiB: no card comes near it; a larger amount is absurd, not a card's share
CLAIM_KEY_TAG = "resourceclaim:"
SHARED_NAMED = 5  # pods a shared claim's report names


@dataclass(frozen=True)
class DeviceResult:
    """One ``status.allocation.devices.results[]`` entry of our driver."""

    request: str
    pool: str
    device: str
    memory: object = None  # consumedCapacity["memory"] as sent; None when absent


@dataclass(frozen=True)
class Consumer:
    """One ``status.reservedFor[]`` entry."""

    resource: str
    name: str
    uid: str
    api_group: str = ""


@dataclass(frozen=True)
class ClaimObject:
    """A ResourceClaim as the ledger reads it: identity, whether it is allocated, our driver's
    results (others' are dropped) and whom it is reserved for."""

    namespace: str
    name: str
    uid: str = ""
    allocated: bool = False
    results: tuple[DeviceResult, ...] = ()
    others: int = 0  # results of other drivers
    reserved_for: tuple[Consumer, ...] = ()
    device_classes: tuple[str, ...] = ()  # the DeviceClasses its requests name (spec.devices.requests)

    @property
    def key(self) -> str:
        """``namespace/name``: how messages name the claim."""
        return f"{self.namespace or 'default'}/{self.name or '?'}"

    @property
    def pods(self) -> tuple[Consumer, ...]:
        return tuple(c for c in self.reserved_for if c.resource == "pods" and not c.api_group)

    @property
    def ours(self) -> bool:
        """Whether it is a claim of ours: allocated a device of our driver, or asking our
        DeviceClass. No component keeps, counts or tells of any other claim."""
        return bool(self.results) or DRA_DEVICE_CLASS in self.device_classes


def claim_key(namespace: str, name: str) -> str:
    """The ledger key of a claim's units while no pod is reserved for it: never a pod's key
    (a pod's name holds no ``:``)."""
    return f"{namespace or 'default'}/{CLAIM_KEY_TAG}{name or '?'}"


# ---- reading the object ----------------------------------------------------------------------


def _map(value: object, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidObject(f"{path}: expected an object, got {described(value)}")
    return value


def _list(value: object, path: str, limit: int) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidObject(f"{path}: expected a list, got {described(value)}")
    if len(value) > limit:
        raise InvalidObject(f"{path}: {len(value)} entries, more than {limit}")
    return value


def _str(value: object, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidObject(f"{path}: expected a string, got {described(value)}")
    if len(value) > MAX_NAME:
        raise InvalidObject(f"{path}: {len(value)} characters, more than {MAX_NAME}")
    return value


def read_claim(obj: object) -> ClaimObject:
    """A raw ResourceClaim (API JSON) read into a :class:`ClaimObject`; raises
    :class:`~.errors.InvalidObject` naming the claim and the first field that is wrong."""
    raw = _map(obj, "ResourceClaim")
    meta = _map(raw.get("metadata"), "metadata")
    namespace, name = (
        _str(meta.get("namespace"), "metadata.namespace"),
        _str(meta.get("name"), "metadata.name"),
    )
    where = f"ResourceClaim {namespace or 'default'}/{name or '?'}"
    try:
        status = _map(raw.get("status"), "status")
        allocation = status.get("allocation")
        devices = _map(_map(allocation, "status.allocation").get("devices"), "status.allocation.devices")
        ours, others = [], 0
        path = "status.allocation.devices.results"
        for i, item in enumerate(_list(devices.get("results"), path, MAX_RESULTS)):
            res = _map(item, f"{path}[{i}]")
            if _str(res.get("driver"), f"{path}[{i}].driver") != DRA_DRIVER:
                others += 1
                continue
            consumed = _map(res.get("consumedCapacity"), f"{path}[{i}].consumedCapacity")
            ours.append(
                DeviceResult(
                    request=_str(res.get("request"), f"{path}[{i}].request"),
                    pool=_str(res.get("pool"), f"{path}[{i}].pool"),
                    device=_str(res.get("device"), f"{path}[{i}].device"),
                    memory=consumed.get(DRA_CAPACITY),
                )
            )
        consumers = []
        for i, item in enumerate(_list(status.get("reservedFor"), "status.reservedFor", MAX_RESERVED)):
            ref = _map(item, f"status.reservedFor[{i}]")
            consumers.append(
                Consumer(
                    resource=_str(ref.get("resource"), f"status.reservedFor[{i}].resource"),
                    name=_str(ref.get("name"), f"status.reservedFor[{i}].name"),
                    uid=_str(ref.get("uid"), f"status.reservedFor[{i}].uid"),
                    api_group=_str(ref.get("apiGroup"), f"status.reservedFor[{i}].apiGroup"),
                )
            )
        uid = _str(meta.get("uid"), "metadata.uid")
        classes = _device_classes(_map(_map(raw.get("spec"), "spec").get("devices"), "spec.devices"))
    except InvalidObject as err:
        raise InvalidObject(f"{where}: {err}") from None
    return ClaimObject(
        namespace=namespace,
        name=name,
        uid=uid,
        allocated=isinstance(allocation, dict),
        results=tuple(ours),
        others=others,
        reserved_for=tuple(consumers),
        device_classes=classes,
    )


def _device_classes(devices: Mapping[str, Any]) -> tuple[str, ...]:
    """The DeviceClasses the requests name, each request's and each of its ``firstAvailable``'s."""
    out: list[str] = []
    path = "spec.devices.requests"
    for i, item in enumerate(_list(devices.get("requests"), path, MAX_REQUESTS)):
        req = _map(item, f"{path}[{i}]")
        exactly = _map(req.get("exactly"), f"{path}[{i}].exactly")
        out.append(_str(exactly.get("deviceClassName"), f"{path}[{i}].exactly.deviceClassName"))
        sub = f"{path}[{i}].firstAvailable"
        for j, alt in enumerate(_list(req.get("firstAvailable"), sub, MAX_SUBREQUESTS)):
            out.append(_str(_map(alt, f"{sub}[{j}]").get("deviceClassName"), f"{sub}[{j}].deviceClassName"))
    return tuple(dict.fromkeys(c for c in out if c))


# ---- the claim's hold on cards -------------------------------------------------------------------


def memory_bytes(value: object) -> int:
    """A consumed ``memory`` capacity as whole bytes: ``"5Gi"``, ``"5368709120"``, 5368709120.
    Raises :class:`ValueError` for anything else (fractional, negative, zero, absurd)."""
    try:
        amount = parse_quantity(value)
    except ValueError as err:
        raise ValueError(f"{described(value)} is not a Kubernetes quantity ({err})") from None
    if not amount.is_finite() or amount > MAX_QUANTITY:
        raise ValueError(f"{described(value)} is not a finite quantity")
    if amount <= 0:
        raise ValueError(f"{described(value)} is not a positive amount of bytes")
    if amount != amount.to_integral_value():
        raise ValueError(f"{described(value)} is not a whole number of bytes")
    if amount > MAX_BYTES:
        raise ValueError(f"{described(value)} is more than any card has ({MAX_BYTES} bytes)")
    return int(amount)


def units_of(nbytes: int, names: ResourceNames = DEFAULT_NAMES) -> int:
    """Whole units of ``nbytes``, rounded up (a 5 GiB + 1 byte share holds 6 GiB units)."""
    unit = names.mib_per_unit * 1024 * 1024
    return -(-nbytes // unit)


@dataclass(frozen=True)
class ClaimIgnored(IgnoredRecord):
    """An :class:`~.records.IgnoredRecord` of a claim's allocation: its message names the claim."""

    claim: str = ""

    def message(self) -> str:
        if self.reason is Ignored.SHARED:
            return (
                f"ResourceClaim {self.claim} {self.detail}: its units are counted once, for pod "
                f"{self.key}, and the other pods use the same slice uncounted. A slice is for one pod: "
                "give each pod a claim of its own (from a ResourceClaimTemplate, as the spawner does) "
                "and delete this claim"
            )
        return (
            f"ignoring the GPU allocation of ResourceClaim {self.claim}: {self.detail}; it holds no "
            "card. Only kube-scheduler writes a claim's allocation, from the node's ResourceSlice; "
            "delete the claim (or its pod) and create it again"
        )


def holder(claim: ClaimObject) -> tuple[str, str]:
    """(ledger key, uid) the claim's units are counted under: its first reserved pod's, else the
    claim's own (:func:`claim_key`)."""
    pods = claim.pods
    if pods:
        return f"{claim.namespace or 'default'}/{pods[0].name}", pods[0].uid
    return claim_key(claim.namespace, claim.name), claim.uid


def ignored_claim(claim: ClaimObject, reason: Ignored, detail: str, node: str = "") -> ClaimIgnored:
    key, uid = holder(claim)
    return ClaimIgnored(key=key, uid=uid, reason=reason, detail=detail, node=node, claim=claim.key)


def shared(claim: ClaimObject, node: str = "") -> ClaimIgnored | None:
    """The report of a claim reserved for more than one pod (counted once, for the first), or
    None. Each pod's containers get the whole slice, so the card may give more than it holds."""
    pods = claim.pods
    if len(pods) < 2:
        return None
    named = ", ".join(f"{claim.namespace or 'default'}/{p.name}" for p in pods[:SHARED_NAMED])
    more = f" and {len(pods) - SHARED_NAMED} more" if len(pods) > SHARED_NAMED else ""
    return ignored_claim(claim, Ignored.SHARED, f"is reserved for {len(pods)} pods ({named}{more})", node)


Reading = Allocation | ClaimIgnored | None


def claim_reading(
    claim: ClaimObject,
    node_cards: Callable[[str], Node | None],
    names: ResourceNames = DEFAULT_NAMES,
) -> Reading:
    """The allocation the claim's status gives if it may count on its (known) node; why not; or
    None when it holds nothing of ours (not allocated, or another driver's). A claim whose node
    the ledger does not know yet reads as :data:`None` too: :func:`claim_node` names the node it
    waits for. Over-commit beside other holders is checked by the ledger, not here."""
    if not claim.allocated or not claim.results:
        return None
    node_name = claim_node(claim)
    if not node_name:
        pools = sorted({r.pool for r in claim.results})
        detail = f"its results name pools {pools}, not one node's"
        return ignored_claim(claim, Ignored.WRONG_NODE, detail)
    node = node_cards(node_name)
    if node is None:
        return None
    key, uid = holder(claim)
    shares: dict[str, CardShare] = {}
    for r in claim.results:
        index = device_index(r.device)
        card = node.card_by_index(index) if index is not None else None
        if card is None:
            detail = f"node {node_name} has no card for device {r.device!r}"
            return ignored_claim(claim, Ignored.UNKNOWN_CARD, detail, node_name)
        if r.memory is None:
            units = card.units  # allocated whole: no consumable capacity on this cluster
        else:
            try:
                units = units_of(memory_bytes(r.memory), names)
            except ValueError as err:
                detail = f"device {r.device} consumes {DRA_CAPACITY} {err}"
                return ignored_claim(claim, Ignored.WRONG_AMOUNT, detail, node_name)
        held = shares[card.uuid].units if card.uuid in shares else 0
        shares[card.uuid] = CardShare(uuid=card.uuid, index=card.index, units=units + held)
    return Allocation(key=key, uid=uid, node=node_name, cards=tuple(shares.values()))


def device_index(device: str) -> int | None:
    """The card index of a device name ``gpu-<index>`` (ASCII digits), else None."""
    if not device.startswith(DRA_DEVICE_PREFIX):
        return None
    return ascii_int(device[len(DRA_DEVICE_PREFIX) :], 6)


def claim_node(claim: ClaimObject) -> str | None:
    """The node (pool) of the claim's results; None when they name more than one, "" for none."""
    pools = {r.pool for r in claim.results}
    return next(iter(pools)) if len(pools) == 1 else None
