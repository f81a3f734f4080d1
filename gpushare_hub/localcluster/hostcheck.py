"""What a machine needs to run real nodes (:mod:`.realnodes`), checked before anything starts:
root, the programs the nodes run, and the CNI plugins. Its own module so that the control plane
(:mod:`.controlplane`, which makes the nodes' network) and the real nodes both read it, and
neither imports the other."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .processes import HarnessError

CNI_BIN = Path("/usr/lib/cni")
NEEDED_PROGRAMS = (
    "runc",
    "ip",
    "nsenter",
    "unshare",
    "iptables",
)


def check_host() -> None:
    """Refuse early, naming what is missing, on a machine that cannot run a real node."""
    if os.geteuid() != 0:
        raise HarnessError("real nodes need root (namespaces, mounts, containerd)")
    missing = [p for p in NEEDED_PROGRAMS if shutil.which(p) is None]
    if not (CNI_BIN / "bridge").exists():
        missing.append(f"{CNI_BIN}/bridge")
    if missing:
        raise HarnessError(
            f"real nodes need {', '.join(missing)}: `make system-deps` installs them "
            "(apt-get install runc containernetworking-plugins iptables)"
        )
