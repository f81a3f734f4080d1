"""A stand-in for libnvidia-container's ``nvidia-container-cli`` on nodes with simulated cards.

On a legacy-mode node (``nvidia`` as containerd's default runtime, the NVIDIA container runtime in
its ``legacy`` mode) the runtime adds NVIDIA's prestart hook, ``nvidia-container-runtime-hook``
(built from the toolkit's Go module), to every container; for a container whose
``NVIDIA_VISIBLE_DEVICES`` names cards, the hook execs ``nvidia-container-cli configure
--device=<cards> ... --pid=<container's pid> <rootfs>``. The real CLI (C, libnvidia-container) asks
NVML which device node each card is, which a machine without the driver cannot answer. This one
takes that answer from a file the harness writes (card UUID -> index), and does the rest as the
real one does for device nodes: it makes the card's ``/dev/nvidiaN`` and the control nodes inside
the container's root filesystem, in the container's mount namespace, and allows them in the
container's devices cgroup (v1). Driver libraries are not mounted: a simulated card has none.

Usage, as the hook calls it: ``python -m gpushare_hub.localcluster.fakecli --cards FILE [global
options] configure [options] --device=LIST --pid=PID ROOTFS``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


class CLIError(Exception):
    """What the real CLI would print as ``nvidia-container-cli: <error>``."""


@dataclass(frozen=True)
class Configure:
    devices: list[str]
    pid: int
    rootfs: Path


def parse(argv: list[str]) -> tuple[Path, Configure]:
    """(the cards file, the configure call); global options and the ones a simulated card has no
    use for (capabilities, requirements, ldconfig ...) are accepted and ignored."""
    cards, rest = None, list(argv)
    if rest[:1] == ["--cards"] and len(rest) > 1:
        cards, rest = Path(rest[1]), rest[2:]
    if cards is None:
        raise CLIError("--cards FILE must come first (the harness's card UUID -> index file)")
    if "configure" not in rest:
        raise CLIError(f"only the configure command is simulated, got: {' '.join(rest) or 'nothing'}")
    after = rest[rest.index("configure") + 1 :]
    options = [a for a in after if a.startswith("--")]
    positional = [a for a in after if not a.startswith("--")]
    if len(positional) != 1:
        raise CLIError(f"configure needs exactly one root filesystem, got {positional}")
    found = {k: v for k, _, v in (o[2:].partition("=") for o in options)}
    if not found.get("pid", "").isdigit():
        raise CLIError(f"configure needs --pid=<container's pid>, got {found.get('pid')!r}")
    devices = [d for d in found.get("device", "").split(",") if d]
    return cards, Configure(devices, int(found["pid"]), Path(positional[0]))


def resolve(devices: list[str], cards: dict[str, int]) -> list[int]:
    """Each requested device (a UUID, an index or ``all``) as a card index, as NVML would."""
    indices: list[int] = []
    for d in devices:
        if d == "all":
            picked = sorted(cards.values())
        elif d.isdigit() and int(d) in cards.values():
            picked = [int(d)]
        elif d in cards:
            picked = [cards[d]]
        else:
            raise CLIError(f"device error: {d}: unknown device")
        indices += [i for i in picked if i not in indices]
    return indices


def device_nodes(indices: list[int], dev: Path = Path("/dev")) -> list[tuple[str, int, int]]:
    """(name, major, minor) of each card's node and of the control nodes this machine has."""
    names = [f"nvidia{i}" for i in indices] + [c for c in CONTROL if (dev / c).exists()]
    out = []
    for name in names:
        st = (dev / name).stat()
        if not stat.S_ISCHR(st.st_mode):
            raise CLIError(f"{dev / name} is not a character device")
        out.append((name, os.major(st.st_rdev), os.minor(st.st_rdev)))
    return out


def devices_cgroup(pid: int) -> Path | None:
    """The container's devices cgroup (v1) folder; None on a cgroup v2 machine."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "devices" in controllers.split(","):
            return Path("/sys/fs/cgroup/devices") / path.lstrip("/")
    return None


def configure(call: Configure, cards: dict[str, int]) -> list[str]:
    """Make the nodes in the container and allow them; returns their names."""
    if not call.devices:
        return []
    nodes = device_nodes(resolve(call.devices, cards))
    script = "set -e\n" + "".join(
        f"[ -e {call.rootfs}/dev/{name} ] || mknod -m 666 {call.rootfs}/dev/{name} c {major} {minor}\n"
        for name, major, minor in nodes
    )
    made = subprocess.run(
        ["nsenter", f"--target={call.pid}", "--mount", "--", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if made.returncode != 0:
        raise CLIError(f"mount error: making device nodes in {call.rootfs}: {made.stderr.strip()}")
    cgroup = devices_cgroup(call.pid)
    if cgroup is not None:
        for _, major, minor in nodes:
            (cgroup / "devices.allow").write_text(f"c {major}:{minor} rwm\n")
    return [name for name, _, _ in nodes]


def main(argv: list[str] | None = None) -> int:
    try:
        cards_file, call = parse(sys.argv[1:] if argv is None else argv)
        cards = {str(k): int(v) for k, v in json.loads(cards_file.read_text()).items()}
        made = configure(call, cards)
    except (CLIError, OSError, ValueError) as err:
        print(f"nvidia-container-cli: {err}", file=sys.stderr)
        return 1
    shown = ", ".join(made) or "no device"
    print(f"nvidia-container-cli (simulated): {call.rootfs}: {shown}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
