"""What a ResourceClaim allocated to this node asks of our driver, checked before anything is
prepared (pure).

The kubelet names only the claim (namespace, name, UID); the plugin reads the claim from the API
server and trusts nothing in it that a user could have written or that another node's scheduler
decision could have put there. A claim is refused, with a message naming it and the problem, when
it was replaced (another UID), is not allocated, holds none of our devices or more than one (a
claim is one slice of one card, as the admission policies require), was allocated to another node's
pool, names a device that is not one of this node's cards, consumes no memory or a
size the catalogue does not offer, or more than the card, or more than the card has left beside the
claims already prepared on it. A refused claim prepares nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpushare_hub.core.cards import Card
from gpushare_hub.core.claims import memory_bytes
from gpushare_hub.core.draslice import card_index, device_name, words
from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.names import DRA_CAPACITY, DRA_DRIVER

MAX_RESULTS = 32
# A claim UID as the API server makes it (metadata.uid: a canonical, lower-case UUID). It goes
# into file names (the claim's CDI spec) and CDI device names, so nothing else is taken.
CLAIM_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class ClaimRefused(GPUShareError):
    """The claim cannot be prepared on this node; the message names it and says why."""


def check_uid(namespace: str, name: str, uid: str) -> str:
    """``uid`` if it is a canonical UUID, else :class:`ClaimRefused` naming the claim: checked
    before any path or name is made of it."""
    if not CLAIM_UID.fullmatch(uid):
        raise ClaimRefused(
            f"claim {namespace}/{name}: its UID {uid[:40]!r} is not a canonical UUID "
            "(8-4-4-4-12 lower-case hex, as the API server makes them): nothing done"
        )
    return uid


@dataclass(frozen=True)
class ClaimDevice:
    """One of our devices a claim was allocated: which card, how many bytes, for which requests."""

    requests: tuple[str, ...]
    pool: str
    device: str
    card: Card
    bytes: int
    share_id: str = ""


@dataclass(frozen=True)
class ClaimFacts:
    namespace: str
    name: str
    uid: str
    pod: str  # the pod it is reserved for ("" if none yet)
    pod_uid: str
    devices: tuple[ClaimDevice, ...]

    @property
    def label(self) -> str:
        return f"claim {self.namespace}/{self.name}"


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _bytes(raw: Any, where: str) -> int:
    try:
        return memory_bytes(raw)
    except ValueError as err:
        raise ClaimRefused(f"{where}: the memory it consumes, {err}") from None


def read_claim(
    claim: Any,
    *,
    namespace: str,
    name: str,
    uid: str,
    node: str,
    cards: Sequence[Card],
    unit_bytes: int,
    sizes: Sequence[int],
    prepared: Mapping[str, int] | None = None,
) -> ClaimFacts:
    """The claim's devices of our driver on this node, or :class:`ClaimRefused`.

    ``sizes``: the bytes the catalogue offers (empty: any whole number of units);
    ``prepared``: bytes per card UUID that other prepared claims hold on this node."""
    where = f"claim {namespace}/{name}"
    obj = _dict(claim)
    meta = _dict(obj.get("metadata"))
    if meta.get("uid") != uid:
        raise ClaimRefused(
            f"{where}: the API server holds another claim of that name (UID {str(meta.get('uid'))[:40]}, "
            f"the kubelet asked {uid}); it was deleted and made again: nothing prepared"
        )
    status = _dict(obj.get("status"))
    allocation = _dict(status.get("allocation"))
    results = _list(_dict(allocation.get("devices")).get("results"))
    if not allocation:
        raise ClaimRefused(f"{where} is not allocated yet; the scheduler allocates it before the pod starts")
    if len(results) > MAX_RESULTS:
        raise ClaimRefused(f"{where} holds {len(results)} devices; at most {MAX_RESULTS} are read")
    ours = [_dict(r) for r in results if _dict(r).get("driver") == DRA_DRIVER]
    if not ours:
        raise ClaimRefused(f"{where} holds no device of driver {DRA_DRIVER}: nothing for this plugin")
    if len(ours) > 1:
        held_devices = ", ".join(f"{str(r.get('pool'))[:253]}/{str(r.get('device'))[:40]}" for r in ours)
        raise ClaimRefused(
            f"{where} holds {len(ours)} devices of driver {DRA_DRIVER} ({held_devices}); a claim is one "
            "slice of one card: nothing prepared (ask one device of the gpushare DeviceClass per claim)"
        )
    by_index = {c.index: c for c in cards}
    held = dict(prepared or {})
    devices: dict[str, ClaimDevice] = {}
    for result in ours:
        pool, dev, request = result.get("pool"), result.get("device"), result.get("request")
        if pool != node:
            raise ClaimRefused(
                f"{where} was allocated {str(dev)[:40]} of node {str(pool)[:253]}, not of this node {node}: "
                "nothing prepared (a claim is prepared only on the node its devices belong to)"
            )
        index = card_index(dev)
        card = by_index.get(index) if index is not None else None
        if card is None:
            have = ", ".join(device_name(c.index) for c in cards) or "none"
            raise ClaimRefused(
                f"{where}: device {str(dev)[:40]!r} is not a card of node {node} (its cards: {have})"
            )
        consumed = _dict(result.get("consumedCapacity"))
        if DRA_CAPACITY not in consumed:
            raise ClaimRefused(
                f"{where}: its result for {dev} consumes no {DRA_CAPACITY}; this driver shares cards by "
                f"memory only (ask a slice's size, e.g. with the chart's claim templates)"
            )
        n = _bytes(consumed[DRA_CAPACITY], f"{where}, device {dev}")
        capacity = card.units * unit_bytes
        if n > capacity:
            raise ClaimRefused(f"{where} asks {words(n)} of {dev}, more than the card's {words(capacity)}")
        if sizes and n not in sizes:
            offered = ", ".join(words(s) for s in sizes)
            raise ClaimRefused(
                f"{where} asks {words(n)}, a size this hub does not offer (it offers {offered})"
            )
        if not sizes and n % unit_bytes:
            raise ClaimRefused(f"{where} asks {words(n)}, not a whole number of {words(unit_bytes)} units")
        if held.get(card.uuid, 0) + n > capacity:
            raise ClaimRefused(
                f"{where} asks {words(n)} of {dev}, but prepared claims already hold "
                f"{words(held.get(card.uuid, 0))} of its {words(capacity)}: nothing prepared"
            )
        held[card.uuid] = held.get(card.uuid, 0) + n
        requests = (str(request)[:253],) if isinstance(request, str) else ()
        share = result.get("shareID")
        devices[str(dev)] = ClaimDevice(
            requests, node, str(dev), card, n, share if isinstance(share, str) else ""
        )
    pod, pod_uid = "", ""
    for ref in _list(status.get("reservedFor")):
        ref = _dict(ref)
        if ref.get("resource") == "pods" and isinstance(ref.get("name"), str):
            pod, pod_uid = ref["name"], str(ref.get("uid") or "")
            break
    return ClaimFacts(namespace, name, uid, pod, pod_uid, tuple(devices.values()))
