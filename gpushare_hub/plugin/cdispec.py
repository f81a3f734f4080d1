"""The plugin's own CDI spec: one device per card it serves, named by UUID, of kind gpushare-hub.io/gpu.

Allocate names ``gpushare-hub.io/gpu=<UUID>``; the runtime finds that name in the file this module
writes into the CDI folder (``/var/run/cdi``, which containerd 2 and CRI-O read by default) and
applies its edits: the card's device nodes, the control nodes, the driver's libraries and the
hooks that make them usable (ldcache, symlinks).

**Who makes it.** On a real node, NVIDIA's own generator: the host's ``nvidia-ctk`` as the GPU
Operator's toolkit DaemonSet installs it (``/usr/local/nvidia/toolkit``) or as the distribution's
package does (``/usr/bin``), run inside the plugin's container against the host's root mounted at
``--host-root``, then rebased onto the host's paths by the same tool (``cdi transform root``).
Using the host's toolkit rather than a copy in our image keeps the hook binary the spec names,
the driver it was written for and the runtime that executes it of one version, and keeps our
images free of Go. Simulated cards (tests, demo) get a spec made the same way but for NVML: a
device node per card (``/dev/nvidia<index>`` under ``--dev-root``) and the control nodes beside it.

The file is rewritten when the cards or the driver change and removed when the plugin stops.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.names import CDI_KIND

CDI_VENDOR, _, CDI_CLASS = CDI_KIND.partition("/")
DEFAULT_CDI_DIR = "/var/run/cdi"
SPEC_FILE = f"{CDI_VENDOR}-{CDI_CLASS}.json"
# Where the host's toolkit lives: the GPU Operator's toolkit DaemonSet, then the distribution's package.
CTK_CANDIDATES = ("/usr/local/nvidia/toolkit/nvidia-ctk", "/usr/bin/nvidia-ctk", "/usr/local/bin/nvidia-ctk")
CONTROL_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
SIMULATED = "simulated"
SIMULATED_CDI_VERSION = "0.6.0"
GENERATE_TIMEOUT_S = 120.0
MAX_SPEC_BYTES = 16 << 20


class SpecError(GPUShareError):
    """No spec could be made or written; the message names the step and the fix."""


def under(root: str, path: str) -> str:
    """``path`` (absolute, on the host) as the plugin's container sees it with the host at ``root``."""
    if root in ("", "/"):
        return path
    rest = path.strip("/")
    return f"{root.rstrip('/')}/{rest}" if rest else root.rstrip("/")


def find_ctk(host_root: str, configured: str = "") -> str | None:
    """The host's nvidia-ctk as a host path, or None where the toolkit is not installed."""
    for path in (configured,) if configured else CTK_CANDIDATES:
        if os.access(under(host_root, path), os.X_OK):
            return path
    return None


def generate_commands(
    ctk: str, host_root: str, driver_root: str, dev_root: str, out: Path
) -> list[list[str]]:
    """The nvidia-ctk calls that write the spec for every card NVML sees into ``out``: generate
    against the host's root as mounted here, then rebase its host paths onto the host. The GPU
    Operator installs ``nvidia-ctk`` as a shell wrapper that execs ``nvidia-ctk.real`` by its host
    path, which is not this container's: the binary beside it is run instead (the wrapper sets
    nothing for it)."""
    exe = under(host_root, ctk)
    if os.access(f"{exe}.real", os.X_OK):
        exe = f"{exe}.real"
    generated = out if host_root in ("", "/") else out.with_suffix(".generated.json")
    commands = [
        [
            exe,
            "cdi",
            "generate",
            "--mode=nvml",
            "--format=json",
            f"--vendor={CDI_VENDOR}",
            f"--class={CDI_CLASS}",
            "--device-name-strategy=uuid",
            f"--driver-root={under(host_root, driver_root)}",
            f"--dev-root={under(host_root, dev_root)}",
            f"--nvidia-cdi-hook-path={under(host_root, str(Path(ctk).parent / 'nvidia-cdi-hook'))}",
            f"--output={generated}",
        ]
    ]
    if generated != out:
        commands.append(
            [exe, "cdi", "transform", "root", f"--from={host_root.rstrip('/')}", "--to=/",
             "--relative-to=host", f"--input={generated}", f"--output={out}"]
        )  # fmt: skip
    return commands


def served_only(spec: dict[str, Any], uuids: Sequence[str]) -> dict[str, Any]:
    """The generated spec with only the cards this plugin serves (no ``all`` device, no card the
    plugin skips, such as a MIG-enabled one); :class:`SpecError` if one of them is missing."""
    if spec.get("kind") != CDI_KIND:
        raise SpecError(f"nvidia-ctk wrote a spec of kind {spec.get('kind')!r}, not {CDI_KIND!r}")
    devices = {d.get("name"): d for d in spec.get("devices") or [] if isinstance(d, dict)}
    lost = [u for u in uuids if u not in devices]
    if lost:
        raise SpecError(
            f"nvidia-ctk found no card {', '.join(lost)} "
            f"(it listed {', '.join(map(str, devices)) or 'none'}): "
            "the plugin and the toolkit see different drivers; check --driver-root"
        )
    return {**spec, "devices": [devices[u] for u in uuids]}


def simulated_spec(cards: Sequence[tuple[str, int]], dev_root: str, host_root: str = "") -> dict[str, Any]:
    """A spec for declared cards ``(uuid, index)``: each card's device node and the control
    nodes that exist under ``dev_root`` on the host (read at ``host_root`` here), as NVIDIA's
    generator lays them out (no libraries: there is no driver)."""
    base = dev_root.rstrip("/")
    nodes = [
        {"path": p, "hostPath": f"{base}{p}"}
        for p in CONTROL_NODES
        if os.path.exists(under(host_root, f"{base}{p}"))
    ]
    return {
        "cdiVersion": SIMULATED_CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [
            {
                "name": uuid,
                "containerEdits": {
                    "deviceNodes": [{"path": f"/dev/nvidia{i}", "hostPath": f"{base}/dev/nvidia{i}"}]
                },
            }
            for uuid, i in cards
        ],
        "containerEdits": {"deviceNodes": nodes},
    }


@dataclass
class SpecFile:
    """The spec file in the CDI folder, written whole (temporary file, then rename) and readable
    by the runtime (0644)."""

    folder: Path
    name: str = SPEC_FILE  # the DRA plugin's per-claim specs are files of their own (dra/cdiclaims.py)

    @property
    def path(self) -> Path:
        return self.folder / self.name

    def writable(self) -> str:
        """Empty where the folder can be written; else why not, for the node's Warning event."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.folder, prefix=".gpushare-probe-"):
                pass
        except OSError as err:
            return (
                f"cannot write the CDI folder {self.folder} ({err.strerror or err}): mount the host's "
                f"{DEFAULT_CDI_DIR} into the plugin read-write (the chart does), or set --cdi-dir"
            )
        return ""

    def write(self, spec: dict[str, Any]) -> None:
        body = json.dumps(spec, indent=1, sort_keys=True).encode()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".gpushare-", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except OSError as err:
            raise SpecError(f"cannot write the CDI spec {self.path}: {err}") from err

    def read(self) -> dict[str, Any] | None:
        try:
            raw = self.path.read_bytes()
        except OSError:
            return None
        value = json.loads(raw) if len(raw) <= MAX_SPEC_BYTES else None
        return value if isinstance(value, dict) else None

    def remove(self) -> bool:
        try:
            self.path.unlink()
        except FileNotFoundError:
            return False
        return True


def run_ctk(commands: list[list[str]], timeout: float = GENERATE_TIMEOUT_S) -> None:
    for argv in commands:
        step = " ".join(argv[1:4])
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise SpecError(f"{argv[0]} {step} could not run: {err}") from err
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise SpecError(f"{argv[0]} {step} failed (exit {done.returncode}): {' / '.join(tail)}")


def ctk_spec(
    ctk: str, host_root: str, driver_root: str, dev_root: str, uuids: Sequence[str]
) -> dict[str, Any]:
    """NVIDIA's spec for the cards ``uuids``, made by the host's nvidia-ctk."""
    with tempfile.TemporaryDirectory(prefix="gpushare-cdi-") as tmp:
        out = Path(tmp) / "spec.json"
        run_ctk(generate_commands(ctk, host_root, driver_root, dev_root, out))
        try:
            spec = json.loads(out.read_text())
        except (OSError, ValueError) as err:
            raise SpecError(f"nvidia-ctk wrote no readable spec: {err}") from err
    if not isinstance(spec, dict):
        raise SpecError("nvidia-ctk wrote a spec that is not a JSON object")
    return served_only(spec, uuids)
