"""examples/z2jh-values.yaml agrees with our chart, and (given Zero to JupyterHub's chart) lints."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import CHART, EXAMPLES, KUBE_VERSION, Helm

Z2JH_VALUES = EXAMPLES / "z2jh-values.yaml"


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


def test_the_hub_service_has_a_role_and_the_check_snippet_compiles():
    hub = z2jh()["hub"]
    assert set(hub["services"]) == {"gpushare"}
    assert hub["loadRoles"]["gpushare"]["services"] == ["gpushare"]
    for name, code in hub["extraConfig"].items():
        compile(code, f"hub.extraConfig.{name}", "exec")


def test_the_t4_catalogue_is_one_the_spawner_accepts():
    catalogue = pytest.importorskip("gpushare_hub.spawner.catalogue", reason="GPUShareSpawner not merged yet")
    slices = z2jh()["hub"]["config"]["GPUShareSpawner"]["slices"]
    read = catalogue.read_catalogue(slices)
    assert [s.gib for s in read.slices] == [3, 5, 7]


@pytest.mark.skipif(
    not os.environ.get("GPUSHARE_Z2JH_CHART"),
    reason="set GPUSHARE_Z2JH_CHART to an unpacked Zero to JupyterHub chart (jupyterhub/ of its repo)",
)
def test_zero_to_jupyterhub_lints_the_values_with_its_own_schema(helm: Helm, tmp_path: Path):
    chart = tmp_path / "jupyterhub"
    shutil.copytree(os.environ["GPUSHARE_Z2JH_CHART"], chart)
    schema = chart / "values.schema.yaml"
    if schema.exists() and not (chart / "values.schema.json").exists():  # its repo keeps only the YAML
        (chart / "values.schema.json").write_text(json.dumps(yaml.safe_load(schema.read_text())))
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
