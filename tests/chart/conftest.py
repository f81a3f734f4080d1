"""Chart tier: the real helm binary (built by the local-cluster harness) against our chart.

Rendering needs only helm. Installing needs a control plane of its own: the chart's
admission policies bind cluster-wide and would refuse what other tiers' tests write as
plain users in the shared session cluster.
"""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from gpushare_hub.localcluster import build
from gpushare_hub.localcluster.cluster import LocalCluster
from tests.conftest import running_cluster

ROOT = Path(__file__).parents[2]
CHART = ROOT / "helm" / "gpushare-hub"
EXAMPLES = ROOT / "examples"
# Every values file of ours that sets the gpushare-hub chart (z2jh-values.yaml is Zero to JupyterHub's).
CHART_EXAMPLES = sorted(EXAMPLES.glob("gpushare-hub-values*.yaml"))
KUBE_VERSION = build.Versions.load().kubernetes


class StrictLoader(yaml.SafeLoader):
    """YAML that refuses a key twice in one mapping (the API server would warn or refuse)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise AssertionError(f"key {key!r} twice in one mapping, {key_node.start_mark}")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def generator() -> ModuleType:
    """helm/generate.py, which writes the chart's generated files (not an installed package)."""
    spec = importlib.util.spec_from_file_location("chart_generate", ROOT / "helm" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Helm:
    """The pinned helm binary; every call is a real process."""

    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def run(
        self, *args: str, kubeconfig: Path | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binary), *args]
        if kubeconfig:
            argv.append(f"--kubeconfig={kubeconfig}")
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def template(
        self, *args: str, namespace: str = "gpushare-hub", release: str = "gpushare-hub"
    ) -> list[dict[str, Any]]:
        out = self.run(
            "template",
            release,
            str(CHART),
            f"--namespace={namespace}",
            f"--kube-version={KUBE_VERSION}",
            *args,
        )
        return [d for d in yaml.load_all(out.stdout, Loader=StrictLoader) if d]


@pytest.fixture(scope="session")
def helm() -> Helm:
    binary = build.bin_dir() / "helm"
    if not binary.exists():
        try:
            build.build(only=list(build.GROUPS["clients"]))
        except build.BuildError as err:
            pytest.fail(f"cannot build helm: {err}", pytrace=False)
    return Helm(binary)


@pytest.fixture(scope="module")
def chart_cluster() -> Iterator[LocalCluster]:
    """A control plane of the chart tier's own: default scheduler, two GPU nodes, one CPU node."""
    with running_cluster() as cluster:
        cluster.add_gpu_nodes(2, cards=2)
        cpu = cluster.node_object("cpu-1", ())
        del cpu["metadata"]["labels"]["gpushare"]
        cluster.core_api().create_node(cpu)
        cluster.wait_nodes_ready(["cpu-1"])
        yield cluster
