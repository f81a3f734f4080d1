"""Which layer keeps the GPU from this container, when it sees none: the card's device node, the
driver's library, or a CUDA framework (``gpushare-selftest`` says the first one missing).

The layers, bottom up, as the runtime builds them: the device nodes (``/dev/nvidiactl`` and the
card's ``/dev/nvidiaN``: the CDI spec's ``deviceNodes``, or the NVIDIA runtime in legacy mode), the
driver's user-space library (``libcuda.so.1``, mounted by the same), then a framework built with
CUDA in the image.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable

CARD_NODE = re.compile(r"^nvidia\d+$")


def can_load(name: str) -> bool:
    try:
        ctypes.CDLL(name)
    except OSError:
        return False
    return True


def missing_layer(dev: str = "/dev", load: Callable[[str], bool] = can_load) -> str:
    """Empty where the card's device node and the driver's library are both here; else what is
    missing, which layer puts it there, and the check that tells more."""
    try:
        names = set(os.listdir(dev))
    except OSError:
        names = set()
    cards = sorted(n for n in names if CARD_NODE.match(n))
    if not cards or "nvidiactl" not in names:
        what = "no card device node" if not cards else "no /dev/nvidiactl"
        return (
            f"{what} in {dev}: the runtime gave this container no card. In cdi mode the CDI spec "
            "(/var/run/cdi/gpushare-hub.io-gpu.json on the node) was not applied; in legacy mode the "
            "NVIDIA runtime did not run this container (docs/gpu-operator.md, 'A notebook sees no GPU')"
        )
    if not load("libcuda.so.1"):
        return (
            f"{', '.join(f'{dev}/{c}' for c in cards)} present but the driver's library libcuda.so.1 "
            "cannot be loaded: the CDI spec or the NVIDIA runtime mounted no driver library "
            "(check the plugin's --driver-root)"
        )
    return ""
