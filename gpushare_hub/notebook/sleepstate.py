"""What hibernation says about each kernel of a notebook server: its state, and words for it. Pure.

A kernel is ``awake`` (its GPU processes hold their memory on the card), ``hibernating`` (being
checkpointed), ``hibernated`` (its GPU memory is in the pod's host memory, since a time; the card
holds nothing of it), ``waking`` (being restored), ``waiting`` (a wake that cannot be done yet:
the words say for what, and the place in line), or ``refused`` (the driver would not checkpoint
it: it stays awake, and the words say why). :func:`kernel_json` is what
``<base>gpushare/api/hibernation`` answers per kernel and the status bar shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpushare_hub.core.durations import duration_words
from gpushare_hub.isolation.checkpoint import NOT_SUPPORTED, TIMEOUT, CheckpointError

AWAKE, HIBERNATING, HIBERNATED, WAKING, WAITING, REFUSED = (
    "awake",
    "hibernating",
    "hibernated",
    "waking",
    "waiting",
    "refused",
)
STATES = (AWAKE, HIBERNATING, HIBERNATED, WAKING, WAITING, REFUSED)
GIB = 1 << 30


@dataclass
class Process:
    """One GPU process of a kernel, as the container ledger has it."""

    pid: int
    start: str  # the kernel's start time of the pid (the ledger's key, with the pid)
    held: int  # bytes on the card (awake) or in host memory (hibernated)
    what: str


@dataclass
class KernelSleep:
    """One kernel's hibernation."""

    kernel_id: str
    name: str = ""  # the notebook it runs, where known
    state: str = AWAKE
    since: float | None = None  # Unix seconds: hibernated since
    processes: list[Process] = field(default_factory=list)  # checkpointed ones
    why: str = ""  # refused: the driver's answer; waiting: what it waits for
    place: int | None = None  # waiting: 1 is next
    keep_awake: bool = False
    refused_activity: str = ""  # the kernel's last activity when refused: no retry before new work

    @property
    def held(self) -> int:
        return sum(p.held for p in self.processes)


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def words(k: KernelSleep, now: float) -> str:
    """What the user reads about the kernel."""
    if k.state == HIBERNATED and k.since is not None:
        return (
            f"hibernated {duration_words(int(max(0, now - k.since)))} ago: its {gib(k.held)} of GPU "
            "memory is in host memory; the next cell wakes it with every variable"
        )
    if k.state == HIBERNATING:
        return "hibernating: moving its GPU memory into host memory"
    if k.state == WAKING:
        return f"waking: moving its {gib(k.held)} back onto the card"
    if k.state == WAITING:
        return k.why
    if k.state == REFUSED:
        return f"stays awake: {k.why}"
    return "awake (kept awake)" if k.keep_awake else "awake"


def kernel_json(k: KernelSleep, now: float) -> dict[str, Any]:
    return {
        "id": k.kernel_id,
        "name": k.name,
        "state": k.state,
        "since": k.since,
        "held_mib": k.held >> 20,
        "pids": [p.pid for p in k.processes],
        "place": k.place,
        "keep_awake": k.keep_awake,
        "words": words(k, now),
    }


def summary(kernels: list[KernelSleep]) -> str:
    """The status bar's few words: ``1 kernel hibernated``, ``waking``, ``waiting (1 ahead)``."""
    waiting = [k for k in kernels if k.state == WAITING]
    if waiting:
        ahead = min((k.place or 1) for k in waiting) - 1
        return f"wake waiting ({ahead} ahead)" if ahead else "wake waiting"
    if any(k.state == WAKING for k in kernels):
        return "waking"
    if any(k.state == HIBERNATING for k in kernels):
        return "hibernating"
    asleep = sum(1 for k in kernels if k.state == HIBERNATED)
    if asleep:
        return f"{asleep} kernel{'s' if asleep > 1 else ''} hibernated"
    return ""


def refusal_words(err: CheckpointError) -> str:
    """Why a kernel stays awake, for its user."""
    if err.code == NOT_SUPPORTED:
        return f"the driver does not checkpoint this process ({err}); an MPS client stays awake"
    if err.code == TIMEOUT:
        return f"it kept the GPU busy ({err})"
    return f"the driver refused to checkpoint it ({err})"
