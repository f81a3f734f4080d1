"""docs/zero-to-jupyterhub.md's command and its values file agree with our chart and the other docs,
and (given Zero to JupyterHub's chart) the command runs, as a server-side dry run."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shutil
import sys
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
(Z2JH_VERSION,) = option(COMMAND, "--version")
# The chart of the version the page installs, as ../shared/vendor holds it beside the checkout
# (here /work/shared beside /work/main; in CI /tmp/cirun/shared beside /tmp/cirun/main).
VENDORED_Z2JH = ROOT.parent / "shared" / "vendor" / f"zero-to-jupyterhub-k8s-{Z2JH_VERSION}" / "jupyterhub"


def z2jh_chart_source() -> Path | None:
    """GPUSHARE_Z2JH_CHART when set, else the vendored chart when it is there."""
    if os.environ.get("GPUSHARE_Z2JH_CHART"):
        return Path(os.environ["GPUSHARE_Z2JH_CHART"])
    return VENDORED_Z2JH if (VENDORED_Z2JH / "Chart.yaml").exists() else None


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


def test_the_hub_services_port_is_written_once():
    """custom.gpushare.port is the one number; the Service, the three NetworkPolicies and the
    service's URL take it (aliases, and get_config in the hub)."""
    text = Z2JH_VALUES.read_text()
    values = z2jh()
    port = values["custom"]["gpushare"]["port"]
    assert text.count(str(port)) == 1  # every other place is an alias of it
    hub = values["hub"]
    assert hub["service"]["extraPorts"] == [{"name": "gpushare", "port": port, "targetPort": port}]
    (ingress,) = hub["networkPolicy"]["ingress"]
    (egress,) = values["proxy"]["chp"]["networkPolicy"]["egress"]
    (notebooks,) = values["singleuser"]["networkPolicy"]["egress"]
    assert ingress["ports"] == egress["ports"] == notebooks["ports"] == [{"port": port}]
    assert 'get_config("custom.gpushare.port")' in hub["extraConfig"]["gpushare-service"]


def test_the_t4_catalogue_is_one_the_spawner_accepts():
    from gpushare_hub.core.catalogueread import read_catalogue

    slices = z2jh()["hub"]["config"]["GPUShareSpawner"]["slices"]
    read = read_catalogue(slices)
    assert [s.gib for s in read.slices] == [3, 5, 7]


def z2jh_chart(tmp_path: Path) -> Path:
    source = z2jh_chart_source()
    assert source is not None
    chart = tmp_path / "jupyterhub"
    shutil.copytree(source, chart)
    schema = chart / "values.schema.yaml"
    if schema.exists() and not (chart / "values.schema.json").exists():  # its repo keeps only the YAML
        (chart / "values.schema.json").write_text(json.dumps(yaml.safe_load(schema.read_text())))
    return chart


NEEDS_Z2JH = pytest.mark.skipif(
    z2jh_chart_source() is None,
    reason=f"no {VENDORED_Z2JH}: set GPUSHARE_Z2JH_CHART to an unpacked Zero to JupyterHub chart "
    "(jupyterhub/ of its repository)",
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


def rendered_hub(helm: Helm, tmp_path: Path) -> list[dict[str, Any]]:
    """Zero to JupyterHub's templates with the example values, as its chart renders them."""
    out = helm.run(
        "template",
        "jhub",
        str(z2jh_chart(tmp_path)),
        "--namespace=jupyterhub",
        f"--values={Z2JH_VALUES}",
        f"--kube-version={KUBE_VERSION}",
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def vendored_z2jh_module(chart: Path, values: dict[str, Any]) -> Any:
    """The chart's own files/hub/z2jh.py, reading ``values`` as it reads the hub Secret's values.yaml."""
    spec = importlib.util.spec_from_file_location("z2jh", chart / "files" / "hub" / "z2jh.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    vars(module)["_load_config"] = lambda: values  # in place of reading the hub's mounted Secret
    return module


@NEEDS_Z2JH
def test_zero_to_jupyterhub_puts_the_one_port_in_every_place_and_opens_nothing_wider(
    helm: Helm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """helm resolves the aliases, and the hub's extraConfig, run with the chart's own z2jh module on
    the values the chart hands the hub, gives the service the same port."""
    from traitlets.config import Config

    docs = rendered_hub(helm, tmp_path)
    port = z2jh()["custom"]["gpushare"]["port"]

    def one(kind: str, name: str) -> dict[str, Any]:
        (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
        return doc

    service_ports = {p["name"]: p for p in one("Service", "hub")["spec"]["ports"]}
    assert (service_ports["gpushare"]["port"], service_ports["gpushare"]["targetPort"]) == (port, port)
    hub_ingress = [r["ports"] for r in one("NetworkPolicy", "hub")["spec"]["ingress"] if "ports" in r]
    assert [{"port": port}] in hub_ingress
    proxy_egress = [r["ports"] for r in one("NetworkPolicy", "proxy")["spec"]["egress"] if "ports" in r]
    assert [{"port": port}] in proxy_egress
    # The notebooks reach the service's port on the hub's pod, and only there: the one rule that
    # names the port opens nothing else, and no rule of the chart's own opened it before.
    notebooks = one("NetworkPolicy", "singleuser")
    to_service = [r for r in notebooks["spec"]["egress"] if {"port": port} in r.get("ports", [])]
    assert to_service == [
        {"ports": [{"port": port}], "to": [{"podSelector": {"matchLabels": {"component": "hub"}}}]}
    ]
    hub_pods = one("NetworkPolicy", "hub")["spec"]["podSelector"]["matchLabels"]
    assert hub_pods["component"] == "hub"
    without = [r for r in notebooks["spec"]["egress"] if r not in to_service]
    assert not any(
        any(p.get("port") == port for p in r.get("ports", [])) or ("ports" not in r and not r.get("to"))
        for r in without
    ), without
    secret = one("Secret", "hub")
    values = yaml.safe_load(base64.b64decode(secret["data"]["values.yaml"]))
    assert values["custom"]["gpushare"]["port"] == port
    # The hub's ingress admits the notebooks: they carry the label it opens the port to.
    assert values["singleuser"]["extraLabels"]["hub.jupyter.org/network-access-hub"] == "true"

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setitem(sys.modules, "z2jh", vendored_z2jh_module(tmp_path / "jupyterhub", values))
    c = Config()
    c.KubeSpawner.namespace = "jupyterhub"  # what jupyterhub_config.py sets before extraConfig
    for cls, settings in values["hub"]["config"].items():
        for key, value in settings.items():
            setattr(getattr(c, cls), key, value)
    for key, code in sorted(values["hub"]["extraConfig"].items()):  # as jupyterhub_config.py runs them
        exec(compile(code, f"hub.extraConfig.{key}", "exec"), {"c": c})
    (svc,) = [s for s in c.JupyterHub.services if s["name"] == "gpushare"]
    assert svc["url"] == f"http://hub:{port}"
