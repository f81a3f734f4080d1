"""The real nodes' runtime parts, built from their Go modules at the versions pinned in versions.toml:
containerd 2 (``containerd``, its runc shim, ``ctr``) and the NVIDIA container toolkit
(``nvidia-ctk``, ``nvidia-cdi-hook``, ``nvidia-container-runtime``) at the version the GPU Operator
ships. Debian's containerd 1.6 has no CDI and is past what Kubernetes 1.36+ supports; runc comes
from Debian.

Each part is built once per version with ``go install`` into the cache root
(``tools/<part>-<version>/``), shared by every Kubernetes version, like CoreDNS.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import timing
from .build import VERSIONS_FILE, BuildError, _go_env, build_go_install, cache_root


@dataclass(frozen=True)
class Part:
    table: str  # its table in versions.toml
    module: str
    commands: tuple[str, ...]  # under the module's cmd/
    cgo: bool = False  # the toolkit loads NVML through cgo's dlopen


CONTAINERD = Part(
    "containerd", "github.com/containerd/containerd/v2", ("containerd", "containerd-shim-runc-v2", "ctr")
)
TOOLKIT = Part(
    "nvidia-container-toolkit",
    "github.com/NVIDIA/nvidia-container-toolkit",
    ("nvidia-ctk", "nvidia-cdi-hook", "nvidia-container-runtime", "nvidia-container-runtime-hook"),
    cgo=True,
)


def version_of(part: Part, path: Path = VERSIONS_FILE) -> str:
    data = tomllib.loads(path.read_text())
    try:
        return str(data[part.table]["version"])
    except KeyError as err:
        raise BuildError(f"{path}: missing [{part.table}] version; see the comments in that file") from err


def part_dir(part: Part, path: Path = VERSIONS_FILE) -> Path:
    return cache_root() / "tools" / f"{part.table}-{version_of(part, path)}"


def build_part(part: Part, path: Path = VERSIONS_FILE) -> Path:
    """The folder holding the part's binaries, built once (a concurrent build waits on the lock)."""
    out = part_dir(part, path)
    with timing.timed(f"{part.table} {version_of(part, path)}") as step:
        if not all(os.access(out / c, os.X_OK) for c in part.commands):
            step.cold = True
            _build(part, out, path)
    return out


def _build(part: Part, out: Path, path: Path) -> None:
    if part.cgo and shutil.which("gcc") is None:
        raise BuildError(f"building {part.module} needs a C compiler (NVML through cgo): apt-get install gcc")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f"{part.table}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if all(os.access(out / c, os.X_OK) for c in part.commands):
            return
        work = out.parent / "src"
        work.mkdir(exist_ok=True)
        staged = out.parent / f"{out.name}.partial"
        shutil.rmtree(staged, ignore_errors=True)
        staged.mkdir()
        env = _go_env(work)
        if part.cgo:
            env["CGO_ENABLED"] = "1"
        version = version_of(part, path)
        for command in part.commands:
            build_go_install(f"{part.module}/cmd/{command}", version, "-s -w", work, staged, env)
        shutil.rmtree(out, ignore_errors=True)
        staged.replace(out)


def build_runtime(path: Path = VERSIONS_FILE) -> tuple[Path, Path]:
    """containerd's and the toolkit's folders of binaries."""
    return build_part(CONTAINERD, path), build_part(TOOLKIT, path)
