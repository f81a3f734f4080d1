"""The release's make targets (release/publish.py, as .github/workflows/release.yaml runs them)
against a real OCI registry on 127.0.0.1: the images pushed per architecture and as
multi-architecture lists, the chart pushed with `helm push` and rendered from the registry as the
checkout renders it, the wheel carrying the JupyterLab extension and the licence."""

from __future__ import annotations

import os
import subprocess
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpushare_hub.localcluster.registry import LocalRegistry

from .conftest import CHART, KUBE_VERSION, ROOT, Helm

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
REPOSITORIES = ("gpushare-extender", "gpushare-device-plugin", "k8s-hub-gpushare", "singleuser")
INDEX = "application/vnd.oci.image.index.v1+json"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


def make(target: str, **variables: str) -> str:
    """``make <target> NAME=value ...`` in the checkout, as the release workflow runs it."""
    argv = ["make", "--no-print-directory", target, *(f"{k}={v}" for k, v in variables.items())]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800, env=os.environ)
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_the_chart_pushed_to_the_registry_renders_as_the_checkouts_chart(registry: LocalRegistry, helm: Helm):
    out = make("release-chart", REGISTRY=registry.address, PLAIN_HTTP="1", HELM=str(helm.binary))
    reference = f"oci://{registry.address}/charts/gpushare-hub"
    assert reference in out
    assert registry.tags("charts/gpushare-hub") == [VERSION]
    shown = helm.run("show", "chart", reference, f"--version={VERSION}", "--plain-http").stdout
    assert f"appVersion: {VERSION}" in shown and f"version: {VERSION}" in shown

    def rendered(chart: str, *flags: str) -> str:
        args = [
            "template",
            "gpushare-hub",
            chart,
            *flags,
            "--namespace=gpushare-hub",
            f"--kube-version={KUBE_VERSION}",
        ]
        return helm.run(*args, "--set=hub.serviceAccount.namespace=jupyterhub").stdout

    pulled = rendered(reference, f"--version={VERSION}", "--plain-http")
    assert pulled == rendered(str(CHART))
    # No image flag needed: the chart names the images of its own release.
    assert f"ghcr.io/gpushare-hub/gpushare-extender:{VERSION}" in pulled


def test_the_images_are_pushed_per_architecture_and_listed_under_the_version(registry: LocalRegistry):
    make("release-images", REGISTRY=registry.address, PLAIN_HTTP="1", SUFFIX="-amd64")
    make("release-manifest", REGISTRY=registry.address, PLAIN_HTTP="1", ARCHES="amd64")
    for repository in REPOSITORIES:
        assert registry.tags(repository) == sorted([VERSION, f"{VERSION}-amd64"]), repository
        index = registry.get(f"/v2/{repository}/manifests/{VERSION}", accept=INDEX)
        platforms = [m.get("platform", {}) for m in index["manifests"]]
        assert [(p.get("os"), p.get("architecture")) for p in platforms] == [("linux", "amd64")], index


def test_the_wheel_carries_the_labextension_and_the_licence(tmp_path: Path):
    make("release-python")
    (wheel,) = (ROOT / "dist").glob(f"gpushare_hub-{VERSION}-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith("gpushare_hub/notebook/labextension/package.json") for n in names)
    assert any(n.endswith("licenses/LICENSE") for n in names)
    # The plain package depends on nothing: a notebook image's pins stay as they are.
    meta = zipfile.ZipFile(wheel).read(f"gpushare_hub-{VERSION}.dist-info/METADATA").decode()
    required = [
        line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert required == [], required
    singleuser = [
        line
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:") and 'extra == "singleuser"' in line
    ]
    assert singleuser and not any(k in " ".join(singleuser) for k in ("grpc", "kubernetes", "jupyterhub")), (
        singleuser
    )
