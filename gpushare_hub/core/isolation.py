"""Isolation tiers: how hard a node holds a slice, what a node says about it, what a slice needs.

A node enforces one of three tiers (the device plugin publishes which on its Node,
``gpushare-hub.io/isolation``):

* ``cooperative``: Allocate's environment and the start-up hook; frameworks cap themselves
  and a user can lift the cap in their own process;
* ``mps``: NVIDIA MPS's pinned-memory limit per client, with the daemon's default as a ceiling;
* ``driver``: the NVIDIA container toolkit's memory-limit hook, which reads
  ``NVIDIA_GPU_MEMORY_LIMITS`` from the container and sets the limit through NVML.

The claim is checked, not believed: the plugin runs the self-test on its node and publishes the
result (``gpushare-hub.io/isolation-check``). A node whose check observed a weaker tier than it
claims counts as that weaker tier. A slice of the catalogue may require a tier
(``isolation: mps``); the placer then uses only nodes that enforce it. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from . import checkpointing
from .errors import InvalidObject
from .shapes import shown

COOPERATIVE = "cooperative"
MPS = "mps"
DRIVER = "driver"
TIERS = (COOPERATIVE, MPS, DRIVER)
HARD_TIERS = frozenset({MPS, DRIVER})

# What a user reads beside a slice (the spawn form, the status bar, the out-of-memory note).
WORDS = {
    COOPERATIVE: "cooperative limit for the whole server",
    MPS: "hard limit per process by MPS",
    DRIVER: "hard limit by the driver",
}
# What holds the cap, for messages ("the slice is held by ...").
CAP_WORDS = {
    COOPERATIVE: "the frameworks' own caps, set by gpushare-hub's start-up hook",
    MPS: "the MPS pinned-memory limit",
    DRIVER: "the driver's memory limit (NVIDIA container toolkit)",
}

# Bounds on the check's JSON: it is written by the node's plugin, but read by every reader.
MAX_CHECK_CHARS = 4096


def check_tier(value: object, where: str) -> str:
    """``value`` if it names a tier; :class:`InvalidObject` naming ``where`` and the tiers otherwise."""
    if isinstance(value, str) and value in TIERS:
        return value
    raise InvalidObject(
        f"{where} is {shown(value)}, which is not an isolation tier; use one of {', '.join(TIERS)}"
    )


def satisfies(node_tier: str, required: str | None) -> bool:
    """Whether a node enforcing ``node_tier`` may take a slice that requires ``required``.

    Every node holds a slice at least cooperatively, so only a hard tier is a real requirement.
    """
    return required is None or required == COOPERATIVE or node_tier == required


@dataclass(frozen=True)
class Check:
    """The last self-test on a node: the tier it observed, and whether that meets the claim."""

    observed: str  # a tier, or "none" (no cap held at all), or "unknown" (nothing could be tried)
    ok: bool
    claimed: str = ""  # the tier that was checked (a check of an earlier claim no longer counts)
    checked: str = ""  # RFC 3339, as the plugin wrote it
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "claimed": self.claimed,
            "observed": self.observed,
            "ok": self.ok,
            "checked": self.checked,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class NodeIsolation:
    """A node's tier as its plugin claims it, the check of that claim, and the tier placement uses."""

    claimed: str = COOPERATIVE
    check: Check | None = None
    problem: str = ""  # an annotation that could not be read, in words (the node counts as cooperative)
    device_mode: str = ""  # how the node hands out cards: "cdi", "legacy", or "" (not said)
    checkpoint: bool = False  # its driver can hibernate kernels (core/checkpointing.py)

    @property
    def effective(self) -> str:
        """The claim, unless its check failed: then what the check observed (at least cooperative)."""
        if self.check is None or self.check.ok:
            return self.claimed
        return self.check.observed if self.check.observed in TIERS else COOPERATIVE

    @property
    def words(self) -> str:
        return WORDS[self.effective]


DEVICE_MODES = ("cdi", "legacy")


def read_node_isolation(
    node: str,
    annotations: Mapping[str, Any],
    tier_key: str,
    check_key: str,
    mode_key: str = "",
    checkpoint_key: str = "",
) -> NodeIsolation:
    """The node's tier, device mode and checkpoint support from its annotations; a value that is
    not a tier is ignored, with a problem naming it (the node then counts as ``cooperative``, which
    every node enforces); a device mode that is not one is not shown; anything but ``yes`` is no
    checkpoint."""
    mode = annotations.get(mode_key) if mode_key else None
    return replace(
        _read_tier(node, annotations, tier_key, check_key),
        device_mode=mode if mode in DEVICE_MODES else "",
        checkpoint=bool(checkpoint_key) and checkpointing.supported(annotations.get(checkpoint_key)),
    )


def _read_tier(node: str, annotations: Mapping[str, Any], tier_key: str, check_key: str) -> NodeIsolation:
    raw = annotations.get(tier_key)
    if raw is None or raw == "":
        return NodeIsolation()
    try:
        claimed = check_tier(raw, f"node {node} annotation {tier_key}")
    except InvalidObject as err:
        return NodeIsolation(problem=f"{err}; the node counts as {COOPERATIVE}")
    raw_check = annotations.get(check_key)
    if not raw_check:
        return NodeIsolation(claimed)
    try:
        check = _read_check(raw_check)
    except (ValueError, TypeError) as err:
        return NodeIsolation(
            claimed,
            Check("unknown", False, detail="unreadable check"),
            problem=f"node {node} annotation {check_key} is not a self-test result ({err}); "
            f"the node counts as {COOPERATIVE} until its device plugin checks it again",
        )
    if check.claimed and check.claimed != claimed:
        return NodeIsolation(claimed)  # a check of an earlier claim; the plugin checks again
    return NodeIsolation(claimed, check)


def _read_check(raw: object) -> Check:
    if not isinstance(raw, str) or len(raw) > MAX_CHECK_CHARS:
        raise ValueError(f"expected a JSON object of at most {MAX_CHECK_CHARS} characters")
    d = json.loads(raw)
    if not isinstance(d, dict):
        raise ValueError("expected a JSON object")
    observed, ok = d.get("observed"), d.get("ok")
    if not isinstance(observed, str) or observed not in (*TIERS, "none", "unknown"):
        raise ValueError(f"observed is {str(observed)[:40]!r}, not a tier, 'none' or 'unknown'")
    if not isinstance(ok, bool):
        raise ValueError("ok is not true or false")
    checked, detail, claimed = d.get("checked", ""), d.get("detail", ""), d.get("claimed", "")
    return Check(observed, ok, str(claimed)[:20], str(checked)[:40], str(detail)[:300])
