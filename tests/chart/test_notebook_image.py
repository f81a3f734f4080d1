"""docs/notebook-image.md's recipe, run as written on a base that behaves as Jupyter's
docker-stacks images do (tests/support/docker-stacks-like: jovyan already there and running the
image, a Python prefix jovyan owns, JupyterLab and jupyterhub-singleuser in it): the status bar's
extensions land where that JupyterLab finds them, gpushare-selftest runs, and no package the
image had changes."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.scripts import load_script, require_image_tools

from .conftest import ROOT

build = load_script(ROOT / "images" / "build.py", "images_build")
PAGE = ROOT / "docs" / "notebook-image.md"
BASE_DOCKERFILE = ROOT / "tests" / "support" / "docker-stacks-like" / "Dockerfile"


def recipe() -> str:
    """The page's Dockerfile block, its FROM line made an ARG for the base under test."""
    (block,) = re.findall(r"```dockerfile\n(.*?)```", PAGE.read_text(), flags=re.S)
    lines = block.strip().splitlines()
    assert lines[0].startswith("FROM quay.io/jupyter/"), lines[0]
    return "\n".join(["ARG BASE", "FROM ${BASE}", *lines[1:]]) + "\n"


@dataclass
class Built:
    builder: Any
    base: str
    image: str


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    require_image_tools()
    builder = build.Builder()
    debian = builder.base()
    # The base holds only what a docker-stacks image has; the course image adds our package.
    base_key = build.digest(debian.encode(), BASE_DOCKERFILE.read_bytes())
    base = f"localhost/gpushare-hub/docker-stacks-like:{base_key}"
    key = build.digest(base.encode(), recipe().encode(), builder.sources_key())
    image = f"localhost/gpushare-hub/course-image:{key}"
    folder = tmp_path_factory.mktemp("recipe")
    (folder / "Dockerfile").write_text(recipe())
    with builder.locked():
        if not builder.exists(image):
            builder.wheelhouse()
            if not builder.exists(base):
                builder.bud("docker-stacks-like", BASE_DOCKERFILE, base, ROOT, {"BASE": debian})
            builder.buildah(
                "bud", "--isolation=chroot", "--pull-never", "--layers=false", f"--build-arg=BASE={base}",
                f"--volume={ROOT / 'wheelhouse'}:/wheelhouse:ro", f"--file={folder / 'Dockerfile'}",
                f"--tag={image}", str(folder), nice=True,
            )  # fmt: skip
    return Built(builder, base, image)


def packages(built: Built, ref: str) -> dict[str, str]:
    out = built.builder.run_in(ref, "python", "-m", "pip", "list", "--format=freeze")
    return dict(line.split("==", 1) for line in out.split() if "==" in line)


def test_the_recipe_adds_gpushare_hub_and_changes_no_package_the_image_had(built: Built):
    before, after = packages(built, built.base), packages(built, built.image)
    assert set(after) - set(before) == {"gpushare-hub"} or set(after) - set(before) == {"gpushare_hub"}
    changed = {name: (v, after[name]) for name, v in before.items() if after.get(name) != v}
    assert changed == {}, changed


def test_the_status_bar_and_the_self_test_are_there_for_jovyan(built: Built):
    assert built.builder.run_in(built.image, "id", "-u").strip() == "1000"  # the base's user, kept
    built.builder.run_in(built.image, "python", "-m", "gpushare_hub.notebook.install", "--check")
    listed = built.builder.run_in(built.image, "sh", "-c", "jupyter labextension list 2>&1")
    assert "gpushare-hub-statusbar" in listed and "enabled" in listed, listed
    assert "usage" in built.builder.run_in(built.image, "gpushare-selftest", "--help").lower()
