"""Prepare and Unprepare: what the kubelet asks of the DRA plugin, one claim at a time, idempotent.

Prepare answers every claim it was given: its CDI device IDs, or an error naming the claim and the
problem (:mod:`.claims`), with nothing written for a refused claim. A claim already prepared is
answered from the record (:mod:`.prepared`) without asking the API server again, so a kubelet that
retries, or a plugin that restarted, gets the same answer. Unprepare of a claim never prepared
succeeds. A claim UID that is not a canonical UUID is refused, naming the claim, before any file
name is made of it (:func:`~.claims.check_uid`). Calls are serialised: the kubelet does too, and
the per-card check of what prepared claims hold needs it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpushare_hub.core.cards import Card
from gpushare_hub.core.errors import GPUShareError

from ..matching import Waiting
from ..response import ContainerResponse, Isolation, container_response
from .cdiclaims import cdi_id, claim_spec, spec_file
from .claims import ClaimFacts, ClaimRefused, check_uid, read_claim
from .prepared import PreparedClaim, PreparedClaims, PreparedDevice

log = logging.getLogger("gpushare.dra")


class ClaimSource(Protocol):
    def claim(self, namespace: str, name: str) -> Any:
        """The ResourceClaim's JSON; raises LookupError when there is none."""
        ...


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class Answer:
    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass
class DriverConfig:
    node: str
    unit_bytes: int
    mib_per_unit: int
    sizes: tuple[int, ...]
    cdi_dir: str


class Driver:
    def __init__(
        self,
        config: DriverConfig,
        cards: Callable[[], Sequence[Card]],
        isolation: Callable[[], Isolation],
        source: ClaimSource,
        prepared: PreparedClaims,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.cards = cards
        self.isolation = isolation
        self.source = source
        self.prepared = prepared
        self.on_change = on_change
        self._lock = threading.Lock()

    # ---- prepare ------------------------------------------------------------------------
    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, Answer]:
        out: dict[str, Answer] = {}
        changed = False
        with self._lock:
            for ref in refs:
                try:
                    out[ref.uid], new = self._prepare_one(ref)
                    changed |= new
                except GPUShareError as err:
                    log.warning("prepare refused: %s", err)
                    out[ref.uid] = Answer(error=str(err))
                except Exception as err:  # answered, never raised into gRPC
                    log.exception("prepare of claim %s/%s failed", ref.namespace, ref.name)
                    out[ref.uid] = Answer(
                        error=f"claim {ref.namespace}/{ref.name}: {type(err).__name__}: {err}"
                    )
        if changed:
            self.on_change()
        return out

    def _prepare_one(self, ref: ClaimRef) -> tuple[Answer, bool]:
        check_uid(ref.namespace, ref.name, ref.uid)  # before any path is made of it
        done = self.prepared.get(ref.uid)
        if done is not None and spec_file(self.config.cdi_dir, ref.uid).path.exists():
            return Answer(done.devices), False
        try:
            obj = self.source.claim(ref.namespace, ref.name)
        except LookupError as err:
            raise ClaimRefused(f"claim {ref.namespace}/{ref.name}: {err}; nothing prepared") from None
        facts = read_claim(
            obj,
            namespace=ref.namespace,
            name=ref.name,
            uid=ref.uid,
            node=self.config.node,
            cards=self.cards(),
            unit_bytes=self.config.unit_bytes,
            sizes=self.config.sizes,
            prepared=self.prepared.held(but=ref.uid),
        )
        claim = self._write(facts)
        log.info(
            "prepared claim %s/%s (pod %s): %s",
            ref.namespace,
            ref.name,
            facts.pod or "none yet",
            ", ".join(f"{d.device} {d.bytes >> 20} MiB" for d in claim.devices),
        )
        return Answer(claim.devices), True

    def _response(self, facts: ClaimFacts, card: Card, n: int) -> ContainerResponse:
        units = -(-n // self.config.unit_bytes)
        w = Waiting(
            pod=f"{facts.namespace}/{facts.pod or facts.name}",
            uid=facts.pod_uid,
            container="",
            uuid=card.uuid,
            units=units,
            pod_units=units,
            assumed_ns=0,
            cards=(card.uuid,),
        )
        return container_response(w, card, self.config.mib_per_unit, self.isolation())

    def _write(self, facts: ClaimFacts) -> PreparedClaim:
        responses = [(d.device, self._response(facts, d.card, d.bytes)) for d in facts.devices]
        spec_file(self.config.cdi_dir, facts.uid).write(claim_spec(facts.uid, responses))
        devices = tuple(
            PreparedDevice(
                d.requests,
                d.pool,
                d.device,
                d.card.uuid,
                d.bytes,
                (cdi_id(facts.uid, d.device), *resp.cdi_devices),
                d.share_id,
            )
            for d, (_, resp) in zip(facts.devices, responses, strict=True)
        )
        claim = PreparedClaim(facts.uid, facts.namespace, facts.name, facts.pod, devices, facts.pod_uid)
        self.prepared.put(claim)
        return claim

    # ---- unprepare ----------------------------------------------------------------------
    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        changed = False
        with self._lock:
            for ref in refs:
                try:
                    check_uid(ref.namespace, ref.name, ref.uid)  # before any path is made of it
                    spec_file(self.config.cdi_dir, ref.uid).remove()
                    gone = self.prepared.remove(ref.uid)
                    changed |= gone is not None
                    if gone is not None:
                        log.info("unprepared claim %s/%s", ref.namespace, ref.name)
                    out[ref.uid] = ""
                except ClaimRefused as err:
                    log.warning("unprepare refused: %s", err)
                    out[ref.uid] = str(err)
                except OSError as err:
                    out[ref.uid] = f"claim {ref.namespace}/{ref.name}: cannot remove its CDI spec ({err})"
        if changed:
            self.on_change()
        return out

    def cdi_folder(self) -> Path:
        return Path(self.config.cdi_dir)
