"""docs/support-matrix.md says what the tiers run: each "tested" line names the versions pinned or
installed, so a pin that moves without the page (or a page that names what nothing runs) fails."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

from gpushare_hub.localcluster.build import VERSIONS_FILE, Versions
from gpushare_hub.localcluster.realstack import Z2JH_VERSION
from tests.doccommands import ROOT

PAGE = ROOT / "docs" / "support-matrix.md"


def rows() -> list[tuple[str, str, str]]:
    """(part, versions, how we know) of each line of the table."""
    out = []
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and not set(cells[0]) <= {"-", " "}:
            out.append((cells[0], cells[1], cells[2]))
    return out


def rows_tested(part: str) -> list[tuple[str, str]]:
    return [(versions, how) for p, versions, how in rows() if p == part and how.startswith("tested")]


def minor(version: str) -> str:
    return ".".join(version.removeprefix("v").split(".")[:2])


def images_base_python() -> str:
    spec = importlib.util.spec_from_file_location("images_build", ROOT / "images" / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("images_build", module)  # its dataclasses look themselves up there
    spec.loader.exec_module(module)
    return str(module.BASE_PYTHON)


def test_the_tested_kubernetes_versions_are_the_pinned_ones():
    pinned = [v.kubernetes.removeprefix("v") for v in Versions.all()]
    (versions, how), *_ = rows_tested("Kubernetes")
    assert [v.strip() for v in versions.replace(" and ", ",").split(",")] == pinned
    assert all(v in how for v in pinned)


def test_the_runtime_versions_are_the_pinned_ones():
    pins = tomllib.loads(Path(VERSIONS_FILE).read_text())
    assert rows_tested("containerd")[0][0].startswith(pins["containerd"]["version"].removeprefix("v"))
    toolkit = pins["nvidia-container-toolkit"]["version"].removeprefix("v")
    assert rows_tested("NVIDIA container toolkit")[0][0].startswith(toolkit)


def test_zero_to_jupyterhub_is_the_fixture_the_tiers_install():
    assert rows_tested("Zero to JupyterHub")[0][0] == Z2JH_VERSION


def test_the_tested_jupyterhub_and_kubespawner_are_the_installed_ones():
    hub = minor(importlib.metadata.version("jupyterhub"))
    spawner = minor(importlib.metadata.version("jupyterhub-kubespawner"))
    assert [versions for versions, _ in rows_tested("JupyterHub")] == [hub]
    assert any(spawner in how for _, how in rows_tested("KubeSpawner"))
    # No line calls a JupyterHub "tested" that no tier runs.
    assert all(hub in versions for versions, _ in rows_tested("JupyterHub"))


def test_the_tested_python_is_the_images_and_no_untested_one_is_called_tested():
    base = images_base_python()
    (versions, how), *more = rows_tested("Python")
    assert not more
    assert how.startswith(f"tested: {base}") and "image" in how
    assert set(re.findall(r"\b3\.\d+\b", versions + how)) == {base}, "a Python no tier runs, called tested"
    for p, versions, how in rows():
        if p == "Python" and not how.startswith("tested"):
            assert base not in versions
