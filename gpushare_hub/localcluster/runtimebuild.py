"""The real nodes' parts, built from their Go modules at the versions pinned in versions.toml:
containerd 2 (``containerd``, its runc shim, ``ctr``), the NVIDIA container toolkit
(``nvidia-ctk``, ``nvidia-cdi-hook``, ``nvidia-container-runtime``) at the version the GPU Operator
ships, CoreDNS with the plugins the real nodes' Corefile uses, and CNCF distribution's OCI
registry, which the release targets push to in the tests. Debian's containerd 1.6 has no
CDI and is past what Kubernetes 1.36+ supports; runc comes from Debian.

Each part is built once per version into the cache root (``tools/<part>-<version>...``), shared
by every Kubernetes version: containerd and the toolkit with ``go install``, CoreDNS as a main
of its own.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import timing
from .build import (
    VERSIONS_FILE,
    BuildError,
    Versions,
    _go_env,
    _run,
    _write_module,
    build_go_install,
    cache_root,
)


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


# The OCI registry the release targets push to in the tests (CNCF distribution's `registry`),
# on 127.0.0.1: a real registry, as ghcr.io is to a release.
REGISTRY = Part("registry", "github.com/distribution/distribution/v3", ("registry",))


# Cluster DNS for the real nodes: a main over CoreDNS's coremain (its commands are not used).
COREDNS = Part("coredns", "github.com/coredns/coredns", ())


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


# The CoreDNS plugins the real nodes' Corefile uses (realnodes.py): a CoreDNS with these alone,
# not its whole plugin.cfg, whose cloud back ends (Route 53, Azure, Google Cloud DNS ...) were most
# of its build. A main of CoreDNS's own coremain with the plugins imported, as its docs describe
# for a build with fewer plugins; the binary's name keeps the list.
COREDNS_PLUGINS = ("bind", "cache", "errors", "kubernetes")


def coredns_main(plugins: tuple[str, ...] = COREDNS_PLUGINS) -> str:
    imports = "".join(f'\t_ "github.com/coredns/coredns/plugin/{name}"\n' for name in plugins)
    return (
        "package main\n\nimport (\n"
        + imports
        + '\n\t"github.com/coredns/coredns/coremain"\n)\n\nfunc main() { coremain.Run() }\n'
    )


def build_coredns(path: Path = VERSIONS_FILE) -> Path:
    """CoreDNS at the pinned version with :data:`COREDNS_PLUGINS`, built once into the cache root
    (``tools/coredns-<version>-<plugins' key>``) and shared by every Kubernetes version."""
    version = version_of(COREDNS, path)
    key = hashlib.sha256(coredns_main().encode()).hexdigest()[:8]
    out = cache_root() / "tools" / f"coredns-{version}-{key}"
    with timing.timed(f"CoreDNS {version}") as step:
        if not os.access(out, os.X_OK):
            step.cold = True
            _build_coredns(version, out, path)
    return out


def _build_coredns(version: str, out: Path, path: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / "coredns.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(out, os.X_OK):
            return
        go = Versions.load(path).go_minimum
        mod = out.parent / "src" / "coredns"
        gomod = f"module gpushare.local/coredns\n\ngo {go}\n\nrequire github.com/coredns/coredns {version}\n"
        _write_module(mod, gomod, {"main.go": coredns_main()})
        env = _go_env(mod)
        _run(["go", "mod", "tidy"], mod, env)
        partial = out.with_name(f"{out.name}.partial")
        _run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(partial), "."], mod, env)
        partial.replace(out)
