"""Build the images of images/*/Dockerfile on this machine, without Docker or a registry.

* **Base**: a minimal Debian made by ``debootstrap`` (bookworm, ``minbase``, with Python 3.11
  and pip from Debian), packed once into a tar under the cache folder and reused while what
  goes into it (suite, mirror, packages, clean-up) is unchanged.
* **Python packages**: the wheelhouse (``make wheelhouse IMAGE_PYTHON=3.11``), built on the
  host; the Dockerfiles install from it with ``--no-index``.
* **Images**: Debian's ``buildah`` with ``--isolation chroot --storage-driver vfs`` (no
  daemon, no overlay, runs as root in a plain container), each Dockerfile unchanged but for
  ``--build-arg BASE=<our base>``. An image is tagged with a key of everything that goes in
  (base, Dockerfile, build arguments, the package's sources); a tag that exists is reused.

* **Node images** (:func:`node_images`): what the local real nodes run beside ours and cannot
  pull: ``singleuser`` (a Dockerfile like ours), ``chp`` (Debian's Node.js and the npm
  package ``gpushare-localcluster proxy`` installed), ``pause`` (upstream's ``pause.c`` from
  the pinned Kubernetes module, compiled here) and ``kube-scheduler`` (the binary
  ``gpushare-localcluster build`` made); the last two are made FROM scratch with ``buildah
  copy``. :meth:`Builder.archive` exports an image as a docker-archive tar under a full name,
  for ``ctr -n k8s.io images import``; :func:`import_check` imports such tars into a
  throwaway containerd.

Usage: ``python images/build.py [--check] [--node-images]`` (``--check``: also import the
package inside each image with ``buildah run``; ``--node-images``: also build, check, export
and import the node images); prints each image's size and the seconds it took.
Cache: ``$GPUSHARE_IMAGE_CACHE`` or ``~/.cache/gpushare-hub/images`` (base tars, buildah's
storage, and the archives under ``archives/``).
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
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

ROOT = Path(__file__).resolve().parents[1]
SUITE = "bookworm"  # Python 3.11, as requires-python allows
BASE_PYTHON = "3.11"
PACKAGES = ("python3", "python3-pip", "python-is-python3")
# Dropped from the base after debootstrap: caches and documentation.
CLEAN = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")
# What the package's wheel is made of (its key; a wheel's own bytes change with each build).
# README.md, the wheel's long description only, is left out: editing it rebuilds nothing. The
# JupyterLab extension's sources (labextension/): its build (make setup) goes into the wheel.
SOURCES = ("pyproject.toml", "gpushare_hub", "labextension")
# Developer tooling the images carry in the wheel but never run: editing it rebuilds no image
# (the harness that runs real nodes lives there and changes far more often than the images).
TOOLING = ("gpushare_hub/localcluster/", "gpushare_hub/bench/", "gpushare_hub/demo/")


@dataclass(frozen=True)
class Image:
    name: str
    check: str  # Python run inside the image
    build_args: dict[str, str] = field(default_factory=dict)
    commands: tuple[tuple[str, ...], ...] = ()  # further commands that must succeed inside it

    @property
    def dockerfile(self) -> Path:
        return ROOT / "images" / self.name / "Dockerfile"


_NO_HUB = (
    "import importlib.util as u; "
    "assert not [m for m in ('jupyterhub', 'kubespawner', 'kubernetes') if u.find_spec(m)]"
)
IMAGES = (
    # The extender and plugin images carry neither JupyterHub nor KubeSpawner (the `hub` extra)
    # nor the synchronous kubernetes client (the developer tooling's, in the `demo` extra).
    Image("extender", f"import gpushare_hub.extender.app; {_NO_HUB}"),
    Image("device-plugin", f"import gpushare_hub.plugin.app; {_NO_HUB}"),
    # Zero to JupyterHub's hub image cannot be pulled here: the same Dockerfile on our base
    # (its unprivileged user by UID, as our base has no jovyan).
    # What Zero to JupyterHub's config and hub image bring that our base lacks (the config's
    # curl HTTP client, the idle culler its `cull` values run) comes from the hub-image extra.
    Image(
        "hub",
        "import gpushare_hub.spawner, gpushare_hub.service.app, pycurl, jupyterhub_idle_culler",
        {"NB_USER": "65532", "EXTRAS": "hub,hub-image"},
    ),
)

# The start-up hook as the device plugin hands it to a container: its folder on PYTHONPATH, where
# every Python imports it as ``sitecustomize`` (which loads its modules from beside it: no file
# name when they are missing).
_HOOK_IMPORTS = (
    "import os, subprocess, sys, gpushare_hub.isolation.hookfiles as h; "
    "hook = h.HOOK_DIR / 'sitecustomize.py'; "
    "out = subprocess.run([sys.executable, '-c', 'import sitecustomize as s; print(s.caps and s.__file__)'], "
    "env={**os.environ, 'PYTHONPATH': str(hook.parent)}, capture_output=True, text=True, check=True); "
    "assert out.stdout.strip() == str(hook), out"
)
# Images the local real nodes run beside ours (node_images): built from a Dockerfile on our base.
NODE_IMAGES = (
    # Zero to JupyterHub's user pod: jupyterhub-singleuser with JupyterLab, as uid 1000; the plain
    # package (its hook, the status bar's JupyterLab and server extensions), without KubeSpawner.
    Image(
        "singleuser",
        f"{_HOOK_IMPORTS}; import importlib.util as u; assert not u.find_spec('kubespawner')",
        commands=(
            ("jupyterhub-singleuser", "--version"),
            ("jupyter", "lab", "--version"),
            ("python", "-m", "gpushare_hub.notebook.install", "--check"),
        ),
    ),
)
# The names node_images() returns, in order.
NODE_IMAGE_NAMES = (
    *(i.name for i in IMAGES),
    *(i.name for i in NODE_IMAGES),
    "pause",
    "kube-scheduler",
    "chp",
)
# The pause program as upstream's build/pause/Makefile compiles it (VERSION added per build).
PAUSE_CFLAGS = ("-Os", "-Wall", "-Werror", "-static")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BuildError(RuntimeError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("GPUSHARE_IMAGE_CACHE") or Path.home() / ".cache" / "gpushare-hub" / "images")


def mirror() -> str:
    """Debian's mirror as this machine's apt has it (deb822 or one-line sources)."""
    for path in sorted(Path("/etc/apt").glob("sources.list*")) + sorted(
        Path("/etc/apt/sources.list.d").glob("*")
    ):
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = line.replace("URIs:", " ").split()
            for word in words:
                if word.startswith("http") and word.rstrip("/").endswith("/debian"):
                    return word
    return "http://deb.debian.org/debian"


def run(*argv: str, nice: bool = False, capture: bool = False) -> str:
    cmd = (["nice", "-n", "19"] if nice else []) + list(argv)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc.stdout if capture else ""


def digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def one_at_a_time(method: Callable[Concatenate[Builder, P], R]) -> Callable[Concatenate[Builder, P], R]:
    """Run ``method`` holding the cache's lock (see :meth:`Builder.locked`)."""

    def locked(self: Builder, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.locked():
            return method(self, *args, **kwargs)

    locked.__name__, locked.__doc__ = method.__name__, method.__doc__
    return locked


class Builder:
    def __init__(self, cache: Path | None = None) -> None:
        self.cache = cache or cache_dir()
        self.cache.mkdir(parents=True, exist_ok=True)
        self.timings: dict[str, float] = {}
        self._lock_depth = 0

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The cache's lock, held while an image, a check container or an archive is looked up
        and made: two sessions sharing the cache (a test run beside a harness) would otherwise
        both run `make wheelhouse` into the one wheelhouse folder and build the same tag twice
        (the loser's image left untagged, a full copy under vfs). Reentrant within one Builder."""
        if self._lock_depth:
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
            return
        with (self.cache / "lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            self._lock_depth = 1
            try:
                yield
            finally:
                self._lock_depth = 0

    def buildah(self, *args: str, nice: bool = False, capture: bool = False) -> str:
        return run(
            "buildah",
            f"--root={self.cache / 'storage'}",
            f"--runroot={self.cache / 'run'}",
            "--storage-driver=vfs",
            *args,
            nice=nice,
            capture=capture,
        )

    def exists(self, ref: str, kind: str = "image") -> bool:
        proc = subprocess.run(
            ["buildah", f"--root={self.cache / 'storage'}", f"--runroot={self.cache / 'run'}",
             "--storage-driver=vfs", "inspect", f"--type={kind}", ref],
            capture_output=True,
        )  # fmt: skip
        return proc.returncode == 0

    # -- the base ---------------------------------------------------------------------------

    def base_key(self) -> str:
        spec = {
            "suite": SUITE,
            "mirror": mirror(),
            "variant": "minbase",
            "packages": PACKAGES,
            "clean": CLEAN,
        }
        return digest(json.dumps(spec, sort_keys=True).encode())

    @one_at_a_time
    def base(self) -> str:
        """The base image's reference: imported from the cached tar, made by debootstrap if absent."""
        key = self.base_key()
        ref = f"localhost/gpushare-hub/debian-base:{SUITE}-{key}"
        if self.exists(ref):
            return ref
        tar = self.cache / f"debian-{SUITE}-{key}.tar"
        if not tar.exists():
            start = time.monotonic()
            self.debootstrap(tar)
            self.timings["debootstrap"] = time.monotonic() - start
        start = time.monotonic()
        ctr = self.buildah("from", "scratch", capture=True).strip()
        try:
            self.buildah("add", ctr, str(tar), "/", nice=True)
            # Debian marks its Python externally managed; images install from our wheelhouse.
            self.buildah("config", "--env", "PIP_BREAK_SYSTEM_PACKAGES=1", "--env", "LANG=C.UTF-8",
                         "--cmd", "python", ctr)  # fmt: skip
            self.buildah("commit", "--rm", ctr, ref, nice=True)
        except BuildError:
            self.remove_container(ctr)
            raise
        self.timings["base import"] = time.monotonic() - start
        return ref

    def debootstrap(self, tar: Path) -> None:
        if not shutil.which("debootstrap"):
            raise BuildError("debootstrap is not installed (apt-get install -y debootstrap)")
        rootfs = self.cache / f"rootfs-{os.getpid()}"
        shutil.rmtree(rootfs, ignore_errors=True)
        try:
            run("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs),
                mirror(), nice=True)  # fmt: skip
            for rel in CLEAN:
                for child in (rootfs / rel).glob("*"):
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    elif child.name != "lock":
                        child.unlink()
            partial = tar.with_suffix(".part")
            run("tar", "--numeric-owner", "--xattrs", "-C", str(rootfs), "-cf", str(partial), ".", nice=True)
            partial.rename(tar)
        finally:
            shutil.rmtree(rootfs, ignore_errors=True)

    # -- the images -------------------------------------------------------------------------

    def sources_key(self) -> bytes:
        listed = run(
            "git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "--", *SOURCES, capture=True
        )
        h = hashlib.sha256()
        for rel in sorted(listed.split()):
            path = ROOT / rel
            if path.is_file() and not rel.startswith(TOOLING):
                h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
        return h.digest()

    def image_ref(self, image: Image, base: str) -> str:
        key = digest(
            base.encode(),
            image.dockerfile.read_bytes(),
            json.dumps(image.build_args, sort_keys=True).encode(),
            self.sources_key(),
        )
        return f"localhost/gpushare-hub/{image.name}:{key}"

    def wheelhouse(self) -> None:
        start = time.monotonic()
        run(
            "make",
            "-C",
            str(ROOT),
            "--no-print-directory",
            "wheelhouse",
            f"IMAGE_PYTHON={BASE_PYTHON}",
            nice=True,
        )
        self.timings["wheelhouse"] = time.monotonic() - start

    @one_at_a_time
    def build(self, images: tuple[Image, ...] = IMAGES) -> dict[str, str]:
        """Each image's reference, built where its tag is missing."""
        from gpushare_hub.localcluster import timing

        with timing.timed(f"images: {len(images)} of ours on the Debian base") as step:
            before = dict(self.timings)
            base = self.base()
            refs = {image.name: self.image_ref(image, base) for image in images}
            missing = [image for image in images if not self.exists(refs[image.name])]
            if missing:
                self.wheelhouse()
            for image in missing:
                self.bud(
                    image.name, image.dockerfile, refs[image.name], ROOT, {"BASE": base, **image.build_args}
                )
            step.cold = self.timings != before
            step.note = ", ".join(k for k in self.timings if self.timings[k] != before.get(k))
        return refs

    def bud(
        self, name: str, dockerfile: Path, ref: str, context: Path, build_args: Mapping[str, str]
    ) -> None:
        """Build ``dockerfile`` in ``context`` as ``ref`` (timed as ``build <name>``), then drop
        the repository's other tags."""
        start = time.monotonic()
        args = [f"--build-arg={k}={v}" for k, v in build_args.items()]
        self.buildah("bud", "--isolation=chroot", "--pull-never", "--layers=false", *args,
                     f"--file={dockerfile}", f"--tag={ref}", str(context), nice=True)  # fmt: skip
        self.timings[f"build {name}"] = time.monotonic() - start
        self.prune(ref)

    @one_at_a_time
    def check_container(self, ref: str) -> str:
        """A working container of the image kept for checks (``buildah from`` copies the whole
        image under vfs, so one per image tag is made once and reused)."""
        repo, key = ref.rsplit(":", 1)
        name = f"gpushare-check-{repo.rsplit('/', 1)[1]}-{key}"
        if not self.exists(name, kind="container"):
            self.buildah("from", "--pull-never", f"--name={name}", ref, nice=True)
        return name

    def run_in(self, ref: str, *argv: str, user: str | None = None) -> str:
        """A command inside the image (buildah run, chroot isolation), its stdout; ``user``
        (``uid:gid``) as a pod's runAsUser would, else the image's own."""
        as_user = [f"--user={user}"] if user else []
        return self.buildah("run", "--isolation=chroot", *as_user, self.check_container(ref), "--", *argv,
                            capture=True)  # fmt: skip

    def read_file(self, ref: str, path: str) -> bytes:
        """A file of the image, read through ``buildah mount`` (no program of the image runs:
        works for FROM scratch images whatever ``buildah run`` does with them)."""
        ctr = self.check_container(ref)
        root = Path(self.buildah("mount", ctr, capture=True).strip())
        try:
            return (root / path.lstrip("/")).read_bytes()
        finally:
            self.buildah("umount", ctr)

    def prune(self, keep: str, family: str | None = None) -> None:
        """Other tags of ``keep``'s family (names that start with ``family``, by default its
        repository's) and their check containers (vfs stores each in full)."""
        family = family or keep.rsplit(":", 1)[0] + ":"
        for row in json.loads(self.buildah("containers", "--json", capture=True)) or []:
            if row.get("imagename", "").startswith(family) and row.get("imagename") != keep:
                self.buildah("rm", row["id"])
        for row in json.loads(self.buildah("images", "--json", capture=True)) or []:
            if any(n.startswith(family) and n != keep for n in row.get("names") or []) and keep not in (
                row.get("names") or []
            ):
                self.buildah("rmi", row["id"])

    def size(self, ref: str) -> int:
        """Bytes of the image's layers, uncompressed (the sum of its manifest's layer sizes)."""
        inspected = json.loads(self.buildah("inspect", "--type=image", ref, capture=True))
        return sum(int(layer["size"]) for layer in json.loads(inspected["Manifest"])["layers"])

    def config(self, ref: str) -> dict[str, object]:
        """The image's OCI config (Entrypoint, Cmd, User, Env, WorkingDir ...)."""
        config: dict[str, object] = json.loads(self.buildah("inspect", "--type=image", ref, capture=True))[
            "OCIv1"
        ]["config"]
        return config

    # -- the node images ---------------------------------------------------------------------

    def scratch_image(self, name: str, ref: str, files: Mapping[str, Path], config: list[str]) -> str:
        """``ref`` FROM scratch holding ``files`` (path in the image: file here, mode 0755), with
        ``buildah config`` arguments ``config``; reused where it exists. Its tag is
        ``<version>-<key>``: other tags of that version are dropped, other versions' kept (the
        tiers run more than one Kubernetes version)."""
        if self.exists(ref):
            return ref
        start = time.monotonic()
        ctr = self.buildah("from", "scratch", capture=True).strip()
        try:
            for dest, source in files.items():
                self.buildah("copy", "--chmod=0755", ctr, str(source), dest, nice=True)
            self.buildah("config", *config, ctr)
            self.buildah("commit", "--rm", ctr, ref, nice=True)
        except BuildError:
            self.remove_container(ctr)
            raise
        self.timings[f"build {name}"] = time.monotonic() - start
        self.prune(ref, family=ref.rsplit("-", 1)[0] + "-")
        return ref

    def remove_container(self, ctr: str) -> None:
        subprocess.run(["buildah", f"--root={self.cache / 'storage'}", f"--runroot={self.cache / 'run'}",
                        "--storage-driver=vfs", "rm", ctr], capture_output=True)  # fmt: skip

    @one_at_a_time
    def pause(self) -> str:
        """Upstream's pause image: ``pause.c`` of the pinned Kubernetes module compiled static
        with upstream's flags, FROM scratch, ENTRYPOINT /pause, user 65535."""
        source, kubernetes = pause_source()
        cflags = (*PAUSE_CFLAGS, f"-DVERSION=v{pause_tag(source)}-{kubernetes}")
        if not shutil.which("gcc"):
            raise BuildError("gcc is not installed (apt-get install -y gcc libc6-dev): it compiles pause.c")
        gcc = run("gcc", "--version", capture=True).splitlines()[0]
        key = digest(source.read_bytes(), json.dumps(cflags).encode(), gcc.encode())
        ref = f"localhost/gpushare-hub/pause:{kubernetes}-{key}"
        if self.exists(ref):
            return ref
        with tempfile.TemporaryDirectory(dir=self.cache) as tmp:
            binary = Path(tmp) / "pause"
            run("gcc", *cflags, "-o", str(binary), str(source), nice=True)
            run("strip", str(binary))
            config = ["--entrypoint", '["/pause"]', "--user", "65535:65535"]
            return self.scratch_image("pause", ref, {"/pause": binary}, config)

    @one_at_a_time
    def kube_scheduler(self) -> str:
        """registry.k8s.io/kube-scheduler's layout: the binary ``gpushare-localcluster build``
        made (static Go), at /usr/local/bin/kube-scheduler, FROM scratch."""
        from gpushare_hub.localcluster.build import Versions, bin_dir

        binary = bin_dir() / "kube-scheduler"
        if not binary.is_file():
            raise BuildError(f"{binary} is missing: run `gpushare-localcluster build` first")
        key = digest(binary.read_bytes())
        ref = f"localhost/gpushare-hub/kube-scheduler:{Versions.load().kubernetes}-{key}"
        exe = "/usr/local/bin/kube-scheduler"
        config = ["--entrypoint", json.dumps([exe]), "--env", f"PATH={PATH}"]
        return self.scratch_image("kube-scheduler", ref, {exe: binary}, config)

    @one_at_a_time
    def chp(self) -> str:
        """configurable-http-proxy (images/chp/Dockerfile): Debian's Node.js on our base and the
        npm prefix ``gpushare-localcluster proxy`` installed, copied to /opt/chp."""
        from gpushare_hub.localcluster.hub import proxy_command
        from gpushare_hub.localcluster.processes import HarnessError

        try:
            prefix = proxy_command().parents[2]  # <prefix>/node_modules/.bin/configurable-http-proxy
        except HarnessError as err:
            raise BuildError(str(err)) from err
        base = self.base()
        dockerfile = ROOT / "images" / "chp" / "Dockerfile"
        ref = f"localhost/gpushare-hub/chp:{digest(base.encode(), dockerfile.read_bytes(), tree_key(prefix))}"
        if self.exists(ref):
            return ref
        with tempfile.TemporaryDirectory(dir=self.cache) as tmp:
            shutil.copytree(prefix, Path(tmp) / "chp", symlinks=True)
            self.bud("chp", dockerfile, ref, Path(tmp), {"BASE": base})
        return ref

    def image_id(self, ref: str) -> str:
        if not self.exists(ref):
            raise BuildError(f"no image {ref} in {self.cache / 'storage'}: build it first")
        return self.buildah("inspect", "--type=image", "--format={{.FromImageID}}", ref, capture=True).strip()

    @one_at_a_time
    def archive(self, ref: str, name: str) -> Path:
        """A docker-archive tar of image ``ref`` named ``name`` (a full reference with registry
        and tag, as a pod's ``image:`` names it), for ``ctr -n k8s.io images import``. Cached
        under archives/ by the image's ID and ``name``; written to a partial file, then renamed.
        Archives of images no longer stored go (the images' own pruning decides)."""
        check_full_name(name)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
        folder = self.cache / "archives"
        folder.mkdir(exist_ok=True)
        tar = folder / f"{slug}-{self.image_id(ref)[:12]}-{digest(name.encode())[:8]}.tar"
        if tar.exists():
            return tar
        start = time.monotonic()
        partial = folder / f".{tar.name}.partial-{os.getpid()}"
        partial.unlink(missing_ok=True)
        try:
            self.buildah("push", ref, f"docker-archive:{partial}:{name}", nice=True)
            partial.rename(tar)
        finally:
            partial.unlink(missing_ok=True)
        self.timings[f"archive {name}"] = time.monotonic() - start
        stored = {row["id"][:12] for row in json.loads(self.buildah("images", "--json", capture=True)) or []}
        for old in folder.glob("*.tar"):
            found = re.search(r"-([0-9a-f]{12})-[0-9a-f]{8}\.tar$", old.name)
            if old != tar and (not found or found.group(1) not in stored):
                old.unlink(missing_ok=True)
        return tar


def tree_key(folder: Path) -> bytes:
    """A digest of a folder's relative paths, file bytes and link targets."""
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix().encode()
        if path.is_symlink():
            h.update(b"l" + rel + b"\0" + os.readlink(path).encode() + b"\0")
        elif path.is_file():
            h.update(b"f" + rel + b"\0" + path.read_bytes() + b"\0")
    return h.digest()


def pause_source() -> tuple[Path, str]:
    """``build/pause/linux/pause.c`` of the pinned k8s.io/kubernetes module (downloaded to the Go
    module cache by ``gpushare-localcluster build``), and that Kubernetes version."""
    from gpushare_hub.localcluster.build import Versions, find_go

    kubernetes = Versions.load().kubernetes
    go = find_go()
    modcache = run(go, "env", "GOMODCACHE", capture=True).strip() if go else ""
    source = Path(modcache) / f"k8s.io/kubernetes@{kubernetes}" / "build" / "pause" / "linux" / "pause.c"
    if not modcache or not source.is_file():
        raise BuildError(
            f"pause.c of k8s.io/kubernetes@{kubernetes} is not in the Go module cache ({source}): "
            "run `gpushare-localcluster build` first"
        )
    return source, kubernetes


def pause_tag(source: Path) -> str:
    """The pause image's release (``TAG ?= 3.10.1`` in build/pause/Makefile beside ``source``):
    the tag of registry.k8s.io/pause this build stands for."""
    found = re.search(r"^TAG \?= (\S+)$", (source.parents[1] / "Makefile").read_text(), re.MULTILINE)
    if not found:
        raise BuildError(f"no `TAG ?= ...` line in {source.parents[1] / 'Makefile'}")
    return found.group(1)


def check_full_name(name: str) -> None:
    """``name`` must name its registry and tag: containerd stores ``pause:3.10`` as
    docker.io/library/pause:3.10, which no pod naming registry.k8s.io would find."""
    first, _, rest = name.partition("/")
    if (
        not rest
        or not ("." in first or ":" in first or first == "localhost")
        or ":" not in rest.rsplit("/", 1)[-1]
    ):
        raise BuildError(
            f"image name {name!r} is not a full reference: give registry, repository and tag, "
            "e.g. registry.k8s.io/pause:3.10.1"
        )


def node_images(builder: Builder) -> dict[str, str]:
    """Every image a local real node runs, built where missing: {"extender", "device-plugin",
    "hub", "singleuser", "pause", "kube-scheduler", "chp"} to each one's buildah reference."""
    refs = builder.build((*IMAGES, *NODE_IMAGES))
    refs["pause"] = builder.pause()
    refs["kube-scheduler"] = builder.kube_scheduler()
    refs["chp"] = builder.chp()
    return refs


def package_version() -> str:
    """The package's version (pyproject.toml, the one place it is written; release/version.py)."""
    import tomllib

    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def chart_names(kubernetes: str | None = None) -> dict[str, str]:
    """Names to import each node image under: what our chart, examples/z2jh-values.yaml and the
    kubelet pull by default where they name one (kube-scheduler at the pinned Kubernetes
    version, pause at upstream's tag of the compiled pause.c), ours for the rest."""
    from gpushare_hub.localcluster.build import Versions
    from gpushare_hub.localcluster.hub import PROXY_VERSION

    kubernetes = kubernetes or Versions.load().kubernetes
    source, _ = pause_source()
    ours = package_version()  # the chart's appVersion: its images' default tag
    return {
        "extender": f"ghcr.io/gpushare-hub/gpushare-extender:{ours}",
        "device-plugin": f"ghcr.io/gpushare-hub/gpushare-device-plugin:{ours}",
        "hub": f"ghcr.io/gpushare-hub/k8s-hub-gpushare:{ours}",
        "singleuser": f"ghcr.io/gpushare-hub/singleuser:{ours}",
        "pause": f"registry.k8s.io/pause:{pause_tag(source)}",
        "kube-scheduler": f"registry.k8s.io/kube-scheduler:{kubernetes}",
        "chp": f"quay.io/jupyterhub/configurable-http-proxy:{PROXY_VERSION}",
    }


def is_static_elf(data: bytes) -> bool:
    """An x86-64/any 64-bit little-endian ELF executable with no PT_INTERP (no dynamic loader)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False
    phoff = int.from_bytes(data[0x20:0x28], "little")
    phentsize = int.from_bytes(data[0x36:0x38], "little")
    phnum = int.from_bytes(data[0x38:0x3A], "little")
    types = [
        int.from_bytes(data[phoff + i * phentsize : phoff + i * phentsize + 4], "little")
        for i in range(phnum)
    ]
    return bool(types) and 3 not in types  # 3: PT_INTERP


def check_image(builder: Builder, name: str, ref: str) -> str:
    """Run node image ``name`` as the charts do (``buildah run``); a short line of what it said."""
    dockerfiles = {image.name: image for image in (*IMAGES, *NODE_IMAGES)}
    if name in dockerfiles:
        image = dockerfiles[name]
        builder.run_in(ref, "python", "-c", image.check)
        said = [builder.run_in(ref, *argv).strip().splitlines()[-1] for argv in image.commands]
        return "; ".join(["imports", *said])
    if name == "pause":
        if not is_static_elf(builder.read_file(ref, "/pause")):
            raise BuildError(f"/pause in {ref} is not a static ELF executable")
        return "static ELF; " + builder.run_in(ref, "/pause", "-v", user="65535:65535").strip()
    if name == "kube-scheduler":  # as the chart's `command:` and podSecurityContext run it
        return builder.run_in(ref, "/usr/local/bin/kube-scheduler", "--version", user="65532:65532").strip()
    if name == "chp":  # as Zero to JupyterHub's proxy pod runs it
        out = builder.run_in(ref, "configurable-http-proxy", "--version", user="65534:65534").strip()
        return f"configurable-http-proxy {out}"
    raise BuildError(f"no check for image {name!r}")


class Containerd:
    """A throwaway containerd (root, state, socket and config under one temporary folder), to
    check that ``ctr -n k8s.io images import`` takes our archives; :meth:`close` stops it and
    removes every trace (its mounts, its folder)."""

    def __init__(self) -> None:
        if not shutil.which("containerd") or not shutil.which("ctr"):
            raise BuildError("containerd is not installed (apt-get install -y containerd)")
        self.dir = Path(tempfile.mkdtemp(prefix="gpushare-ctr-", dir="/tmp"))
        self.address = str(self.dir / "containerd.sock")
        root, state, tmp = self.dir / "root", self.dir / "state", self.dir / "tmp"
        tmp.mkdir()
        config = self.dir / "config.toml"
        # No CRI (nothing here runs pods); the opt plugin's folder (default /opt/containerd) here.
        config.write_text(
            "version = 2\n"
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{self.dir / "opt"}"\n'
        )
        self.log = (self.dir / "containerd.log").open("wb")
        self.proc = subprocess.Popen(
            ["containerd", "--config", str(config), "--root", str(root), "--state", str(state),
             "--address", self.address],
            stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(tmp)},
        )  # fmt: skip
        try:
            self.wait_ready()
        except BaseException:
            self.close()
            raise

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise BuildError(f"containerd exited ({self.proc.returncode}):\n{self.log_tail()}")
            probe = subprocess.run(["ctr", "--address", self.address, "version"], capture_output=True)
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise BuildError(
                    f"containerd did not answer on {self.address} in {timeout:.0f} s:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def log_tail(self) -> str:
        return (self.dir / "containerd.log").read_text(errors="replace")[-3000:]

    def ctr(self, *args: str) -> str:
        return run("ctr", "--address", self.address, "--namespace", "k8s.io", *args, nice=True, capture=True)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        for mount in reversed(mounts_under(self.dir)):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def mounts_under(folder: Path) -> list[str]:
    """Mount points at or below ``folder``, in mount order (/proc/self/mountinfo)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(folder) or point.startswith(f"{folder}/"):
            found.append(point)
    return found


@contextmanager
def containerd() -> Iterator[Containerd]:
    daemon = Containerd()
    try:
        yield daemon
    finally:
        daemon.close()


def import_check(archives: Mapping[str, Path]) -> list[str]:
    """Import each tar (name: tar) into a throwaway containerd's k8s.io namespace as the real
    nodes do; the names ``ctr images ls`` lists afterwards. Raises when a name is missing."""
    with containerd() as daemon:
        for tar in archives.values():
            daemon.ctr("images", "import", str(tar))
        listed = daemon.ctr("images", "ls", "--quiet").split()
        missing = [name for name in archives if name not in listed]
        if missing:
            raise BuildError(
                f"ctr imported the archives but lists no {', '.join(missing)} (it lists {listed})"
            )
        daemon.ctr("images", "rm", *archives)
    return listed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="import the package inside each image")
    parser.add_argument(
        "--node-images",
        action="store_true",
        help="also build the images local real nodes run (singleuser, pause, kube-scheduler, chp), "
        "check each, export each as a docker archive and import those into a throwaway containerd",
    )
    args = parser.parse_args(argv)
    start = time.monotonic()
    builder = Builder()
    try:
        if args.node_images:
            node_main(builder)
        else:
            refs = builder.build()
            for image in IMAGES:
                if args.check:
                    builder.run_in(refs[image.name], "python", "-c", image.check)
                print(f"{refs[image.name]}  {builder.size(refs[image.name]) / 2**20:.0f} MiB")
    except BuildError as err:
        print(err, file=sys.stderr)
        return 1
    for step, seconds in builder.timings.items():
        print(f"{step}: {seconds:.0f} s")
    print(f"total: {time.monotonic() - start:.0f} s")
    return 0


def node_main(builder: Builder) -> None:
    """``--node-images``: build, check, export and import every node image; print what each is."""
    refs = node_images(builder)
    names = chart_names()
    archives = {}
    for key, ref in refs.items():
        said = check_image(builder, key, ref)
        archives[names[key]] = tar = builder.archive(ref, names[key])
        size, tar_size = builder.size(ref) / 2**20, tar.stat().st_size / 2**20
        print(f"{key}: {ref}  {size:.0f} MiB, archive {tar_size:.0f} MiB as {names[key]} ({said})")
    if shutil.which("containerd"):
        started = time.monotonic()
        import_check(archives)
        builder.timings["containerd import (all)"] = time.monotonic() - started
        print(f"ctr -n k8s.io images import: all {len(archives)} archives listed under their names")
    else:
        print("containerd is not installed: the archives were not imported (apt-get install -y containerd)")


if __name__ == "__main__":
    sys.exit(main())
