"""The images of images/*/Dockerfile build here and run the package (images/build.py).

buildah (chroot isolation, vfs storage) builds each Dockerfile unchanged on a debootstrap
base, from the host-built wheelhouse; an image whose inputs are unchanged is reused from
the cache. ``buildah run`` then runs Python inside each one. GPUSHARE_SKIP_IMAGES=1 skips
this module (a machine without buildah and debootstrap).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest

from .conftest import ROOT


def images_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("images_build", ROOT / "images" / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


build = images_module()


@dataclass
class Built:
    builder: Any
    refs: dict[str, str]
    seconds: float


@pytest.fixture(scope="module")
def built() -> Built:
    if os.environ.get("GPUSHARE_SKIP_IMAGES") == "1":
        pytest.skip("GPUSHARE_SKIP_IMAGES=1")
    missing = [tool for tool in ("buildah", "debootstrap") if not shutil.which(tool)]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not installed: apt-get install -y buildah debootstrap", pytrace=False
        )
    builder = build.Builder()
    start = time.monotonic()
    try:
        refs = builder.build()
    except build.BuildError as err:
        pytest.fail(str(err), pytrace=False)
    return Built(builder, refs, time.monotonic() - start)


@pytest.mark.parametrize("image", build.IMAGES, ids=lambda i: i.name)
def test_the_package_imports_inside_each_image(built: Built, image: Any):
    out = built.builder.run_in(built.refs[image.name], "python", "-c", f"{image.check}; print('imported')")
    assert out.strip() == "imported"


def inspect(built: Built, name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(
        built.builder.buildah("inspect", "--type=image", built.refs[name], capture=True)
    )["OCIv1"]["config"]
    return config


def test_each_image_runs_its_component_as_the_dockerfile_says(built: Built):
    extender, plugin = inspect(built, "extender"), inspect(built, "device-plugin")
    assert extender["Entrypoint"] == ["gpushare-extender"] and extender["User"] == "65532:65532"
    assert plugin["Entrypoint"] == ["gpushare-device-plugin"]
    uid = built.builder.run_in(built.refs["extender"], "python", "-c", "import os; print(os.getuid())")
    assert uid.strip() == "65532"
    # The console scripts are there and start (their --help needs no cluster).
    for name, script in (("extender", "gpushare-extender"), ("device-plugin", "gpushare-device-plugin")):
        assert "--" in built.builder.run_in(built.refs[name], script, "--help")


def test_nothing_came_from_the_package_index(built: Built):
    """Our wheel and its dependencies are the wheelhouse's: pip has no index configured inside."""
    out = built.builder.run_in(
        built.refs["device-plugin"],
        "python",
        "-c",
        "import importlib.metadata as m; print(m.version('gpushare-hub'), m.version('grpcio'))",
    )
    ours, grpc = out.split()
    assert ours == "0.1.0" and grpc


def test_a_second_build_reuses_every_image(built: Built, capsys: pytest.CaptureFixture[str]):
    again = build.Builder()
    start = time.monotonic()
    assert again.build() == built.refs
    assert again.timings == {}, again.timings  # no debootstrap, no wheelhouse, no build
    sizes = {name: built.builder.size(ref) for name, ref in built.refs.items()}
    assert all(size > 0 for size in sizes.values())
    with capsys.disabled():
        print()
        for name, ref in built.refs.items():
            print(f"  image {name}: {sizes[name] / 2**20:.0f} MiB ({ref})")
        steps = ", ".join(f"{k} {v:.0f} s" for k, v in built.builder.timings.items()) or "all cached"
        print(
            f"  images built in {built.seconds:.0f} s ({steps}); reused in {time.monotonic() - start:.1f} s"
        )
