"""The claims this node's DRA plugin has prepared, on disk, so that a restart loses none.

Prepare writes the claim's CDI spec, then records it here, before it answers the kubelet; Unprepare
removes both. After a restart the plugin answers a Prepare it has already done from this record
(the kubelet asks again when it does not know whether an answer arrived), counts these claims'
bytes per card before it admits another, and orders its ResourceSlice's cards by them. The file
is written whole (temporary file, then rename) and read with bounds: a damaged file is logged and
set aside, never trusted in part.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("gpushare.dra")

STATE_FILE = "prepared-claims.json"
MAX_STATE_BYTES = 8 << 20


@dataclass(frozen=True)
class PreparedDevice:
    requests: tuple[str, ...]
    pool: str
    device: str
    card: str  # UUID
    bytes: int
    cdi_ids: tuple[str, ...]
    share_id: str = ""


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    pod: str
    devices: tuple[PreparedDevice, ...]
    pod_uid: str = ""


def _claim(raw: Any) -> PreparedClaim:
    devices = tuple(
        PreparedDevice(
            tuple(str(r) for r in d["requests"]),
            str(d["pool"]),
            str(d["device"]),
            str(d["card"]),
            int(d["bytes"]),
            tuple(str(i) for i in d["cdi_ids"]),
            str(d.get("share_id") or ""),
        )
        for d in raw["devices"]
    )
    return PreparedClaim(
        str(raw["uid"]), str(raw["namespace"]), str(raw["name"]), str(raw["pod"]), devices,
        str(raw.get("pod_uid") or ""),
    )  # fmt: skip


class PreparedClaims:
    """Claim UID -> what was prepared for it; every change is on disk before it returns."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / STATE_FILE
        self._lock = threading.Lock()
        self.claims: dict[str, PreparedClaim] = {}
        self.load()

    def load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as err:
            log.error("cannot read %s (%s): prepared claims are not known after this restart", self.path, err)
            return
        try:
            if len(raw) > MAX_STATE_BYTES:
                raise ValueError(f"larger than {MAX_STATE_BYTES} bytes")
            data = json.loads(raw)
            self.claims = {c.uid: c for c in map(_claim, data["claims"])}
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            damaged = self.path.with_suffix(".damaged")
            with contextlib.suppress(OSError):
                os.replace(self.path, damaged)
            log.error(
                "%s is damaged (%s); set aside as %s. Claims prepared before this restart are prepared "
                "again when the kubelet asks",
                self.path,
                err,
                damaged,
            )
            return
        log.info("%d prepared claim(s) read from %s", len(self.claims), self.path)

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"claims": [asdict(c) for c in self.claims.values()]}, sort_keys=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def get(self, uid: str) -> PreparedClaim | None:
        return self.claims.get(uid)

    def put(self, claim: PreparedClaim) -> None:
        with self._lock:
            self.claims[claim.uid] = claim
            self._save()

    def remove(self, uid: str) -> PreparedClaim | None:
        with self._lock:
            gone = self.claims.pop(uid, None)
            if gone is not None:
                self._save()
            return gone

    def held(self, but: str = "") -> dict[str, int]:
        """Bytes per card UUID that prepared claims hold (leaving out claim ``but``)."""
        out: dict[str, int] = {}
        for uid, claim in self.claims.items():
            if uid == but:
                continue
            for d in claim.devices:
                out[d.card] = out.get(d.card, 0) + d.bytes
        return out

    def slices(self) -> dict[str, tuple[str, dict[str, int]]]:
        """For the usage loop: pod UID -> (namespace/name, {card UUID: MiB}) of each prepared
        claim reserved for a pod."""
        out: dict[str, tuple[str, dict[str, int]]] = {}
        for claim in list(self.claims.values()):
            if not claim.pod_uid:
                continue
            _, cards = out.setdefault(claim.pod_uid, (f"{claim.namespace}/{claim.pod}", {}))
            for d in claim.devices:
                cards[d.card] = cards.get(d.card, 0) + (d.bytes >> 20)
        return out

    def remove_file_if_empty(self) -> bool:
        """On the way out: no file is left on the node when no claim is prepared."""
        if self.claims:
            return False
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        return True
