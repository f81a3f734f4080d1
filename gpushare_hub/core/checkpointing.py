"""Whether a node's driver can hibernate a notebook's kernels (CUDA's process checkpoint). Pure.

The device plugin says so on its Node (:data:`~gpushare_hub.core.names.CHECKPOINT_ANNOTATION`):
``yes``, or ``no: <why>``. The hub service reads it: the idle action ``auto`` (the default) is
``hibernate`` for a slice on such a node and ``notify`` elsewhere (``service/idle.py``).

What NVIDIA documents (github.com/NVIDIA/cuda-checkpoint, its README): the driver API
``cuCheckpointProcess*`` (with a lock that takes a timeout, which the notebook's hibernator uses)
is in display drivers 570 and newer; checkpointing is x86-64 only and does not support UVM or
IPC memory. So a node qualifies with a 570+ driver on x86-64 and without MPS, whose clients share
their server's memory (the hibernator would refuse each kernel, one by one). The simulated
backend's fake framework models the calls, so simulated nodes qualify.
"""

from __future__ import annotations

FIRST_DRIVER = 570
YES = "yes"
SIMULATED = "simulated"


def support(driver: str, machine: str, mps: bool) -> str:
    """``yes`` or ``no: <why>`` for a node with this driver version (``580.159.04``, ``simulated``
    or "" when unknown), CPU (``platform.machine()``) and MPS setting."""
    if mps:
        return "no: MPS runs on this node, and gpushare-hub does not hibernate MPS clients"
    if driver == SIMULATED:
        return YES
    major = driver.split(".", 1)[0]
    if not major.isdigit():
        return "no: the driver's version is unknown (the checkpoint API needs 570 or newer)"
    if int(major) < FIRST_DRIVER:
        return f"no: driver {driver[:40]} has no CUDA checkpoint API (it needs {FIRST_DRIVER} or newer)"
    if machine not in ("x86_64", "AMD64"):
        return f"no: CUDA's checkpoint is x86-64 only, and this node is {machine[:40] or 'unknown'}"
    return YES


def supported(raw: object) -> bool:
    """Whether the annotation's value says the node can hibernate kernels."""
    return raw == YES
