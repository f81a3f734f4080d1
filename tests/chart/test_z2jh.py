"""docs/zero-to-jupyterhub.md's command and its values file agree with our chart and the other docs,
and (given Zero to JupyterHub's chart) the command runs, as a server-side dry run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare_hub.localcluster.cluster import LocalCluster
from tests.doccommands import ROOT, doc_block, option

from .conftest import CHART, EXAMPLES, KUBE_VERSION, Helm
from .docrun import Kubectl, run_block

# The hub's install or upgrade, as docs/zero-to-jupyterhub.md writes it.
(COMMAND,) = doc_block("z2jh").commands()
(VALUES_ARG,) = option(COMMAND, "--values", "-f")
Z2JH_VALUES = ROOT / VALUES_ARG


def test_the_docs_install_the_example_values_beside_the_gpushare_chart():
    assert Z2JH_VALUES == EXAMPLES / "z2jh-values.yaml"
    assert COMMAND[:5] == ["helm", "upgrade", "--install", "jhub", "jupyterhub/jupyterhub"]
    # The hub's namespace is the one the gpushare install gives read access to (docs/install.md).
    (install,) = [a for a in doc_block("install").commands() if a[0] == "helm"]
    (hub_ns,) = [
        v.split("=", 1)[1] for v in option(install, "--set") if v.startswith("hub.serviceAccount.namespace=")
    ]
    assert option(COMMAND, "--namespace", "-n") == [hub_ns]
    assert z2jh()["hub"]["image"]["name"].endswith("/k8s-hub-gpushare")


def test_the_chart_version_is_the_hub_images_base():
    """Zero to JupyterHub tags its hub image with its chart's version: ours is built on that image."""
    dockerfile = (ROOT / "images" / "hub" / "Dockerfile").read_text()
    (base,) = [line.split("=", 1)[1] for line in dockerfile.splitlines() if line.startswith("ARG BASE=")]
    assert base == f"quay.io/jupyterhub/k8s-hub:{option(COMMAND, '--version')[0]}"


def z2jh() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(Z2JH_VALUES.read_text())
    return values


def test_gpu_pods_go_to_the_charts_scheduler_on_the_plugins_nodes():
    ours = yaml.safe_load((CHART / "values.yaml").read_text())
    spawner = z2jh()["hub"]["config"]["GPUShareSpawner"]
    assert z2jh()["hub"]["config"]["JupyterHub"]["spawner_class"] == "gpushare_hub.GPUShareSpawner"
    assert spawner["gpushare_scheduler_name"] == ours["schedulerName"]
    assert spawner["gpu_node_selector"] == ours["devicePlugin"]["nodeSelector"]
    assert all(t in ours["devicePlugin"]["tolerations"] for t in spawner["gpu_tolerations"])


def test_the_hub_service_and_the_check_snippets_compile():
    """What they add to the hub: tests/unit/test_examples.py (run as Zero to JupyterHub runs them)."""
    hub = z2jh()["hub"]
    assert set(hub["extraConfig"]) == {"gpushare-check", "gpushare-service"}
    assert "configure_hub(" in hub["extraConfig"]["gpushare-service"]
    for name, code in hub["extraConfig"].items():
        compile(code, f"hub.extraConfig.{name}", "exec")


def test_the_t4_catalogue_is_one_the_spawner_accepts():
    catalogue = pytest.importorskip("gpushare_hub.core.catalogue", reason="GPUShareSpawner not merged yet")
    slices = z2jh()["hub"]["config"]["GPUShareSpawner"]["slices"]
    read = catalogue.read_catalogue(slices)
    assert [s.gib for s in read.slices] == [3, 5, 7]


def z2jh_chart(tmp_path: Path) -> Path:
    chart = tmp_path / "jupyterhub"
    shutil.copytree(os.environ["GPUSHARE_Z2JH_CHART"], chart)
    schema = chart / "values.schema.yaml"
    if schema.exists() and not (chart / "values.schema.json").exists():  # its repo keeps only the YAML
        (chart / "values.schema.json").write_text(json.dumps(yaml.safe_load(schema.read_text())))
    return chart


NEEDS_Z2JH = pytest.mark.skipif(
    not os.environ.get("GPUSHARE_Z2JH_CHART"),
    reason="set GPUSHARE_Z2JH_CHART to an unpacked Zero to JupyterHub chart (jupyterhub/ of its repo)",
)


@NEEDS_Z2JH
def test_zero_to_jupyterhub_lints_the_values_with_its_own_schema(helm: Helm, tmp_path: Path):
    chart = z2jh_chart(tmp_path)
    helm.run("lint", "--strict", str(chart), f"--values={Z2JH_VALUES}", f"--kube-version={KUBE_VERSION}")
    bad = helm.run(
        "lint",
        str(chart),
        f"--values={Z2JH_VALUES}",
        "--set=hub.bogus=1",
        f"--kube-version={KUBE_VERSION}",
        check=False,
    )
    assert bad.returncode != 0 and "bogus" in bad.stdout + bad.stderr  # its schema was applied


@NEEDS_Z2JH
def test_the_docs_command_runs_against_the_local_api_server(
    helm: Helm, tmp_path: Path, chart_cluster: LocalCluster
):
    """The page's command as written, with the chart repository's name replaced by the unpacked
    chart and --dry-run=server added (nothing is installed)."""
    chart = str(z2jh_chart(tmp_path))
    kubectl = Kubectl(chart_cluster.kubeconfig)

    def local(argv: list[str]) -> list[str]:
        return [chart if a == "jupyterhub/jupyterhub" else a for a in argv] + ["--dry-run=server"]

    (out,) = run_block(doc_block("z2jh"), helm.binary, kubectl, extra=local)
    assert "STATUS: pending-install" in out or "STATUS: pending-upgrade" in out, out
