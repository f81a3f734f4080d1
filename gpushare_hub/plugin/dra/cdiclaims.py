"""A prepared claim's CDI spec: one file per claim, one device per card it holds (pure but for
the file itself).

The device ``gpushare-hub.io/claim=<claim UID>-gpu-<index>`` carries what the device plugin's
Allocate gives a container (:func:`~gpushare_hub.plugin.response.container_response`): the slice's
variables, the start-up hook's mount, on MPS nodes the card's pipe and its pinned limit, on
``driver`` nodes the toolkit's memory-limit variables. The card itself comes, in CDI mode, from the
plugin's card spec (``gpushare-hub.io/gpu=<UUID>``, named beside it in the kubelet's answer), in
legacy mode from ``NVIDIA_VISIBLE_DEVICES`` read by the NVIDIA runtime. The claim's UID is in the
device's name because runtimes cache specs: a claim made again under the same name gets new names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpushare_hub.core.names import DRA_CLAIM_CDI_KIND

from ..cdispec import SIMULATED_CDI_VERSION, SpecFile
from ..response import ContainerResponse
from .claims import CLAIM_UID

VENDOR, _, CLASS = DRA_CLAIM_CDI_KIND.partition("/")
SPEC_PREFIX = f"{VENDOR}-{CLASS}_"


def spec_file(cdi_dir: str | Path, claim_uid: str) -> SpecFile:
    """The claim's spec file; ``claim_uid`` must be a canonical UUID (the driver checked it,
    :func:`~.claims.check_uid`; this is the last guard before a path is made of it)."""
    if not CLAIM_UID.fullmatch(claim_uid):
        raise ValueError(f"claim UID {claim_uid[:40]!r} is not a canonical UUID")
    return SpecFile(Path(cdi_dir), f"{SPEC_PREFIX}{claim_uid}.json")


def cdi_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def cdi_id(claim_uid: str, device: str) -> str:
    return f"{DRA_CLAIM_CDI_KIND}={cdi_name(claim_uid, device)}"


def claim_spec(claim_uid: str, devices: Sequence[tuple[str, ContainerResponse]]) -> dict[str, Any]:
    """The spec: for each (device name, what its containers get), a CDI device of that claim."""
    out = []
    for device, resp in devices:
        edits: dict[str, Any] = {"env": [f"{k}={v}" for k, v in sorted(resp.envs.items())]}
        if resp.mounts:
            edits["mounts"] = [
                {
                    "hostPath": m.host_path,
                    "containerPath": m.container_path,
                    "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "rbind"],
                }
                for m in resp.mounts
            ]
        out.append({"name": cdi_name(claim_uid, device), "containerEdits": edits})
    return {"cdiVersion": SIMULATED_CDI_VERSION, "kind": DRA_CLAIM_CDI_KIND, "devices": out}


def leftover_specs(cdi_dir: str | Path, keep: set[str]) -> list[Path]:
    """Our per-claim spec files in the folder whose claim is not in ``keep`` (UIDs)."""
    folder = Path(cdi_dir)
    try:
        names = [p for p in folder.iterdir() if p.name.startswith(SPEC_PREFIX) and p.suffix == ".json"]
    except OSError:
        return []
    return [p for p in names if p.name[len(SPEC_PREFIX) : -len(".json")] not in keep]
