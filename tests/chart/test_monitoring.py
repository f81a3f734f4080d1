"""The chart's monitoring (metrics.*): the device plugins' PodMonitor, the hub service's
ServiceMonitor, the alert rules and the Grafana dashboard; every metric they name is one that
gpushare-hub exports, and a setting they need that is missing stops `helm install` naming it."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from .conftest import CHART, KUBE_VERSION, ROOT, Helm

OPERATOR = (
    "--api-versions=monitoring.coreos.com/v1/ServiceMonitor",
    "--api-versions=monitoring.coreos.com/v1/PrometheusRule",
    "--api-versions=monitoring.coreos.com/v1/PodMonitor",
)
ALL_ON = (
    "--set=hub.serviceAccount.namespace=jupyterhub",
    "--set=metrics.hubService.enabled=true",
    "--set=metrics.hubService.tokenSecret.name=prometheus-hub-token",
    "--set=metrics.prometheusRule.enabled=true",
    "--set=metrics.grafanaDashboard.enabled=true",
)
METRIC = re.compile(r"\bgpushare_[a-z_]+\b")


def exported_metrics() -> set[str]:
    """Every metric name gpushare_hub's sources define: literal names, and the hub service's
    f"{PREFIX}_..." names (its unit GiB)."""
    names: set[str] = set()
    for path in (ROOT / "gpushare_hub").rglob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r'"(gpushare_[a-z_]+)"', text))
        for rest, unit in re.findall(r'f"\{PREFIX\}_([a-z_]+?)(\{unit\})?"', text):
            names.add(f"gpushare_{rest}{'gib' if unit else ''}")
    return names


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_with_the_operator_every_monitor_rule_and_the_dashboard_are_made(helm: Helm):
    docs = helm.template(*OPERATOR, *ALL_ON)
    plugin = one(docs, "DaemonSet", "gpushare-device-plugin")["spec"]["template"]
    pod_monitor = one(docs, "PodMonitor", "gpushare-device-plugin")["spec"]
    assert pod_monitor["selector"]["matchLabels"].items() <= plugin["metadata"]["labels"].items()
    ports = {p["name"] for c in plugin["spec"]["containers"] for p in c.get("ports", [])}
    assert pod_monitor["podMetricsEndpoints"][0]["port"] in ports
    hub = one(docs, "ServiceMonitor", "gpushare-hub-service")
    assert hub["metadata"]["namespace"] == "jupyterhub"
    (endpoint,) = hub["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("gpushare", "/services/gpushare/metrics")
    assert endpoint["authorization"]["credentials"] == {"name": "prometheus-hub-token", "key": "token"}
    alerts = {
        r["alert"] for g in one(docs, "PrometheusRule", "gpushare-hub")["spec"]["groups"] for r in g["rules"]
    }
    assert alerts == {
        "GPUShareIsolationCheckFailed",
        "GPUShareSpawnWaiting",
        "GPUShareExtenderErrors",
        "GPUShareBindsRefused",
    }
    dashboard = json.loads(one(docs, "ConfigMap", "gpushare-hub-dashboard")["data"]["gpushare-hub.json"])
    assert dashboard["uid"] == "gpushare-hub" and len(dashboard["panels"]) >= 6


def test_without_the_operator_or_by_default_nothing_of_it_is_made(helm: Helm):
    kinds = {d["kind"] for d in helm.template(*ALL_ON)}
    assert not kinds & {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    defaults = helm.template(*OPERATOR)
    assert {d["kind"] for d in defaults} >= {"ServiceMonitor", "PodMonitor"}  # the extenders' and plugins'
    assert not any(
        d["kind"] == "PrometheusRule" or d["metadata"]["name"] == "gpushare-hub-dashboard" for d in defaults
    )


def test_every_metric_the_rules_and_the_dashboard_name_is_exported(helm: Helm):
    docs = helm.template(*OPERATOR, *ALL_ON)
    rules = one(docs, "PrometheusRule", "gpushare-hub")["spec"]["groups"]
    exprs = [r["expr"] for g in rules for r in g["rules"]]
    dashboard = json.loads((CHART / "files" / "grafana" / "gpushare-hub.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    named = {m for e in exprs for m in METRIC.findall(e)}
    exported = exported_metrics()
    assert {"gpushare_pending_longest_seconds", "gpushare_node_isolation_check_failed"} <= exported
    assert named and named <= exported, f"not exported: {sorted(named - exported)}"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (
            ("--set=metrics.hubService.enabled=true", "--set=metrics.hubService.tokenSecret.name=t"),
            "hub.serviceAccount.namespace",
        ),
        (
            ("--set=metrics.hubService.enabled=true", "--set=hub.serviceAccount.namespace=jupyterhub"),
            "metrics.hubService.tokenSecret.name",
        ),
        (("--set=metrics.prometheusRule.pendingFor=soon",), "pendingFor"),
    ],
)
def test_a_missing_or_wrong_monitoring_value_stops_the_install_naming_it(
    helm: Helm, args: tuple[str, ...], named: str
):
    proc = helm.run(
        "template",
        "gpushare-hub",
        str(CHART),
        f"--kube-version={KUBE_VERSION}",
        *OPERATOR,
        *args,
        check=False,
    )
    assert proc.returncode != 0 and named in proc.stderr, proc.stderr
