"""What the node has for handing out cards (I/O): the runtime, its config, the toolkit, the CDI folder;
and the keeper of the plugin's CDI spec, rewritten when the cards or the driver change.

The decision itself is pure, in :mod:`.devicemode`.
"""

from __future__ import annotations

import glob
import logging
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cdispec import CTK_CANDIDATES, SIMULATED, SpecFile, ctk_spec, find_ctk, simulated_spec, under
from .devicemode import NodeFacts

log = logging.getLogger("gpushare.plugin")
DEFAULT_CONTAINERD_CONFIG = "/etc/containerd/config.toml"
# The CRI plugin's sections: containerd 1.x (config version 2), then 2.x (version 3).
CRI_SECTIONS = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")
MAX_CONFIG_BYTES = 1 << 20
MAX_IMPORTS = 64


@dataclass(frozen=True)
class HostPaths:
    """Where the plugin finds the host's parts (the chart mounts the host's root at /host)."""

    cdi_dir: str = "/var/run/cdi"
    host_root: str = ""  # "" or "/": the plugin runs on the host itself (tests, a systemd unit)
    driver_root: str = "/"  # the GPU Operator's driver container: /run/nvidia/driver
    dev_root: str = "/"
    nvidia_ctk: str = ""  # "": the toolkit's usual places
    containerd_config: str = DEFAULT_CONTAINERD_CONFIG


def _load(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is over {MAX_CONFIG_BYTES} bytes")
    return tomllib.loads(raw.decode())


def _table(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key)
    return value if isinstance(value, dict) else {}


def containerd_settings(paths: HostPaths) -> tuple[bool | None, bool | None, str]:
    """From the host's containerd config and the files it imports (drop-ins such as the GPU
    Operator's ``conf.d/99-nvidia.toml``, later ones winning): whether the CRI plugin has CDI on
    and whether ``nvidia`` is its default runtime; ``None`` and a note where it cannot be read."""
    main = Path(under(paths.host_root, paths.containerd_config))
    try:
        docs = [_load(main)]
        imports = docs[0].get("imports") or []
        for pattern in imports[:MAX_IMPORTS] if isinstance(imports, list) else []:
            host_pattern = str(pattern)
            if not host_pattern.startswith("/"):
                host_pattern = str(Path(paths.containerd_config).parent / host_pattern)
            for found in sorted(glob.glob(under(paths.host_root, host_pattern)))[:MAX_IMPORTS]:
                docs.append(_load(Path(found)))
    except FileNotFoundError:
        return None, None, f"{paths.containerd_config} is not on this node or not mounted into the plugin"
    except (OSError, ValueError, tomllib.TOMLDecodeError) as err:
        return None, None, f"cannot read {paths.containerd_config}: {err}"
    cdi: bool | None = None
    default: str | None = None
    for doc in docs:
        plugins = _table(doc, "plugins")
        for section in CRI_SECTIONS:
            cri = _table(plugins, section)
            if isinstance(cri.get("enable_cdi"), bool):
                cdi = cri["enable_cdi"]
            runtime = _table(cri, "containerd")
            if isinstance(runtime.get("default_runtime_name"), str):
                default = runtime["default_runtime_name"]
    return cdi, (default == "nvidia") if default is not None else False, ""


def probe(runtime: str, paths: HostPaths, simulated: bool) -> NodeFacts:
    """The facts :func:`.devicemode.choose` decides from. ``runtime``: the Node's
    ``status.nodeInfo.containerRuntimeVersion``."""
    cdi, nvidia_default, note = containerd_settings(paths)
    ctk = SIMULATED if simulated else find_ctk(paths.host_root, paths.nvidia_ctk)
    spec_problem = ""
    if ctk is None:
        where = paths.nvidia_ctk or ", ".join(c.rsplit("/", 1)[0] for c in CTK_CANDIDATES)
        spec_problem = (
            f"the NVIDIA container toolkit's nvidia-ctk is not in {where} on this node"
            + (f" (the host's root is read at {paths.host_root})" if paths.host_root not in ("", "/") else "")
            + ": install the toolkit (the GPU Operator's toolkit DaemonSet does), or set --nvidia-ctk"
        )
    return NodeFacts(
        runtime=runtime,
        cdi_enabled=cdi,
        nvidia_default=nvidia_default,
        config_note=note,
        spec_source=ctk or "",
        spec_problem=spec_problem,
        cdi_dir_problem=SpecFile(Path(paths.cdi_dir)).writable(),
        simulated=simulated,
    )


class SpecKeeper:
    """The plugin's CDI spec on this node: made at start, made again when the cards or the driver
    version change, removed when the plugin stops."""

    def __init__(self, paths: HostPaths, source: str) -> None:
        self.paths = paths
        self.source = source  # the nvidia-ctk host path, or SIMULATED
        self.file = SpecFile(Path(paths.cdi_dir))
        self._made_for: tuple[tuple[tuple[str, int], ...], str] | None = None

    def refresh(self, cards: Sequence[tuple[str, int]], driver: str) -> bool:
        """Write the spec for ``cards`` ``(uuid, index)`` unless it was written for the same
        cards and driver; True when it was (re)written. Raises :class:`.cdispec.SpecError`."""
        key = (tuple(cards), driver)
        if key == self._made_for and self.file.path.exists():
            return False
        if self.source == SIMULATED:
            spec = simulated_spec(cards, self.paths.dev_root, self.paths.host_root)
        else:
            p = self.paths
            spec = ctk_spec(self.source, p.host_root, p.driver_root, p.dev_root, [u for u, _ in cards])
        self.file.write(spec)
        self._made_for = key
        log.info("CDI spec %s written for %d card(s), driver %s", self.file.path, len(cards), driver or "?")
        return True

    def remove(self) -> None:
        if self.file.remove():
            log.info("CDI spec %s removed", self.file.path)
