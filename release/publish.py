"""The release's steps, each one a make target, so that the release workflow
(.github/workflows/release.yaml) and the tests run the same code, the tests against a real OCI
registry on 127.0.0.1 (CNCF distribution's, built from its Go module):

- ``images``: our images (images/*/Dockerfile, built by images/build.py on its Debian base) pushed
  to ``REGISTRY/<name>:<version><suffix>`` (``make release-images``; the workflow runs it once per
  architecture, on a runner of that architecture, with ``SUFFIX=-amd64`` / ``-arm64``);
- ``manifest``: each image's multi-architecture list ``REGISTRY/<name>:<version>`` over those
  (``make release-manifest``);
- ``chart``: the chart packaged and pushed as an OCI artifact, ``oci://REGISTRY/charts``
  (``make release-chart``; ``helm install gpushare-hub oci://REGISTRY/charts/gpushare-hub
  --version <version>`` installs it);
- ``python``: the sdist and the wheel in ``dist/``, checked to carry the JupyterLab extension and
  the licence (``make release-python``; the workflow publishes them to PyPI).

``--plain-http``: the registry speaks HTTP (a test's on 127.0.0.1), not HTTPS.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from version import version  # release/version.py, beside this script: the one reader

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "out" / "release"
# Our images and their names in a registry (the chart's and the examples' defaults).
REPOSITORIES = {
    "extender": "gpushare-extender",
    "device-plugin": "gpushare-device-plugin",
    "hub": "k8s-hub-gpushare",
    "singleuser": "singleuser",
}


def images_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("images_build", ROOT / "images" / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def push_images(
    registry: str,
    plain_http: bool,
    suffix: str = "",
    tag: str | None = None,
    refs: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Build (or reuse) our images and push each to ``REGISTRY/<name>:<tag><suffix>`` (``tag``: the
    package's version unless given); the names pushed, by image. ``refs``: push these buildah
    references (by image, a subset of :data:`REPOSITORIES`) instead of building."""
    if refs is None:
        build = images_module()
        refs = build.Builder().build((*build.IMAGES, *build.NODE_IMAGES))
    builder = images_module().Builder()
    pushed = {}
    for name, repository in REPOSITORIES.items():
        if name not in refs:
            continue
        target = f"{registry}/{repository}:{tag or version()}{suffix}"
        builder.buildah(
            "push", f"--tls-verify={str(not plain_http).lower()}", refs[name], f"docker://{target}"
        )
        pushed[name] = target
        print(f"pushed {target}")
    return pushed


def push_manifests(registry: str, plain_http: bool, arches: list[str]) -> list[str]:
    """For each image, the list ``REGISTRY/<name>:<version>`` over its ``-<arch>`` images."""
    build = images_module()
    builder = build.Builder()
    tls = f"--tls-verify={str(not plain_http).lower()}"
    lists = []
    for repository in REPOSITORIES.values():
        target = f"{registry}/{repository}:{version()}"
        local = f"localhost/release-list/{repository}:{version()}"
        if builder.exists(local, "manifest"):
            builder.buildah("manifest", "rm", local)
        builder.buildah("manifest", "create", local)
        for arch in arches:
            builder.buildah("manifest", "add", tls, local, f"docker://{target}-{arch}")
        builder.buildah("manifest", "push", "--all", tls, local, f"docker://{target}")
        lists.append(target)
        print(f"pushed the list {target} ({', '.join(arches)})")
    return lists


def push_chart(registry: str, plain_http: bool, helm: str, chart_version: str | None = None) -> str:
    """Package the chart and push it to ``oci://REGISTRY/charts``; the chart's reference.
    ``chart_version``: package it as that version and appVersion (its images' default tag)
    instead of the package's version, as a later release would be."""
    OUT.mkdir(parents=True, exist_ok=True)
    v = chart_version or version()
    subprocess.run(
        [helm, "package", str(ROOT / "helm" / "gpushare-hub"), f"--destination={OUT}",
         f"--version={v}", f"--app-version={v}"],
        check=True,
    )  # fmt: skip
    package = OUT / f"gpushare-hub-{v}.tgz"
    subprocess.run(
        [helm, "push", str(package), f"oci://{registry}/charts", *(["--plain-http"] if plain_http else [])],
        check=True,
    )
    return f"oci://{registry}/charts/gpushare-hub"


def build_python(out: Path) -> list[Path]:
    """The sdist and the wheel, built with uv; the wheel must carry the built JupyterLab extension
    (``make labextension`` first) and the licence."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("gpushare_hub-*"):
        old.unlink()
    subprocess.run(["uv", "build", "--out-dir", str(out), str(ROOT)], check=True)
    (wheel,) = out.glob(f"gpushare_hub-{version()}-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    needed = ["gpushare_hub/notebook/labextension/package.json", "licenses/LICENSE"]
    missing = [n for n in needed if not any(name.endswith(n) for name in names)]
    if missing:
        raise SystemExit(f"{wheel.name} lacks {', '.join(missing)}: run `make labextension` first")
    return sorted(out.glob(f"gpushare_hub-{version()}*"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=["images", "manifest", "chart", "python"])
    parser.add_argument("--registry", default="ghcr.io/gpushare-hub", help="where images and the chart go")
    parser.add_argument("--plain-http", action="store_true", help="the registry speaks HTTP (a test's)")
    parser.add_argument("--suffix", default="", help="images: after the version in the tag, e.g. -amd64")
    parser.add_argument("--arch", action="append", default=[], help="manifest: an architecture's images")
    parser.add_argument("--helm", default="helm", help="chart: the helm binary")
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="python: where the files go")
    args = parser.parse_args(argv)
    if args.step == "images":
        push_images(args.registry, args.plain_http, args.suffix)
    elif args.step == "manifest":
        if not args.arch:
            parser.error(
                "manifest needs --arch for each architecture pushed (e.g. --arch amd64 --arch arm64)"
            )
        push_manifests(args.registry, args.plain_http, args.arch)
    elif args.step == "chart":
        print(push_chart(args.registry, args.plain_http, args.helm))
    else:
        for path in build_python(args.out):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
