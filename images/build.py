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

Usage: ``python images/build.py [--check]`` (``--check``: also import the package inside
each image with ``buildah run``); prints each image's size and the seconds it took.
Cache: ``$GPUSHARE_IMAGE_CACHE`` or ``~/.cache/gpushare-hub/images`` (base tars and
buildah's storage).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITE = "bookworm"  # Python 3.11, as requires-python allows
BASE_PYTHON = "3.11"
PACKAGES = ("python3", "python3-pip", "python-is-python3")
# Dropped from the base after debootstrap: caches and documentation.
CLEAN = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")
# What the package's wheel is made of (its key; a wheel's own bytes change with each build).
# README.md, the wheel's long description only, is left out: editing it rebuilds nothing.
SOURCES = ("pyproject.toml", "gpushare_hub")


@dataclass(frozen=True)
class Image:
    name: str
    check: str  # Python run inside the image
    build_args: dict[str, str] = field(default_factory=dict)

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
    Image("hub", "import gpushare_hub.spawner, gpushare_hub.service.app", {"NB_USER": "65532"}),
)


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


class Builder:
    def __init__(self, cache: Path | None = None) -> None:
        self.cache = cache or cache_dir()
        self.cache.mkdir(parents=True, exist_ok=True)
        self.timings: dict[str, float] = {}

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
            subprocess.run(["buildah", f"--root={self.cache / 'storage'}", f"--runroot={self.cache / 'run'}",
                            "--storage-driver=vfs", "rm", ctr], capture_output=True)  # fmt: skip
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
            if path.is_file():
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

    def build(self, images: tuple[Image, ...] = IMAGES) -> dict[str, str]:
        """Each image's reference, built where its tag is missing."""
        base = self.base()
        refs = {image.name: self.image_ref(image, base) for image in images}
        missing = [image for image in images if not self.exists(refs[image.name])]
        if missing:
            self.wheelhouse()
        for image in missing:
            start = time.monotonic()
            args = [f"--build-arg={k}={v}" for k, v in {"BASE": base, **image.build_args}.items()]
            self.buildah("bud", "--isolation=chroot", "--pull-never", "--layers=false", *args,
                         f"--file={image.dockerfile}", f"--tag={refs[image.name]}", str(ROOT),
                         nice=True)  # fmt: skip
            self.timings[f"build {image.name}"] = time.monotonic() - start
            self.prune(refs[image.name])
        return refs

    def check_container(self, ref: str) -> str:
        """A working container of the image kept for checks (``buildah from`` copies the whole
        image under vfs, so one per image tag is made once and reused)."""
        repo, key = ref.rsplit(":", 1)
        name = f"gpushare-check-{repo.rsplit('/', 1)[1]}-{key}"
        if not self.exists(name, kind="container"):
            self.buildah("from", "--pull-never", f"--name={name}", ref, nice=True)
        return name

    def run_in(self, ref: str, *argv: str) -> str:
        """A command inside the image (buildah run, chroot isolation), its stdout."""
        return self.buildah("run", "--isolation=chroot", self.check_container(ref), "--", *argv, capture=True)

    def prune(self, keep: str) -> None:
        """Other tags of ``keep``'s repository and their check containers (vfs stores each in full)."""
        repo = keep.rsplit(":", 1)[0]
        for row in json.loads(self.buildah("containers", "--json", capture=True)) or []:
            if row.get("imagename", "").startswith(repo + ":") and row.get("imagename") != keep:
                self.buildah("rm", row["id"])
        for row in json.loads(self.buildah("images", "--json", capture=True)) or []:
            if any(n.startswith(repo + ":") and n != keep for n in row.get("names") or []) and keep not in (
                row.get("names") or []
            ):
                self.buildah("rmi", row["id"])

    def size(self, ref: str) -> int:
        """Bytes of the image's layers, uncompressed (the sum of its manifest's layer sizes)."""
        inspected = json.loads(self.buildah("inspect", "--type=image", ref, capture=True))
        return sum(int(layer["size"]) for layer in json.loads(inspected["Manifest"])["layers"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="import the package inside each image")
    args = parser.parse_args(argv)
    start = time.monotonic()
    builder = Builder()
    try:
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


if __name__ == "__main__":
    sys.exit(main())
