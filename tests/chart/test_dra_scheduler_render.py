"""The chart's dra.scheduler: "default" leaves DRA pods to the cluster's default scheduler;
"gpushare" gives our scheduler a second profile with a prioritize-only extender entry, exactly
what `gpushare-extender --print-scheduler-config --dra-scheduler-name` prints, and refuses a
kube-scheduler older than 1.36."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpushare_hub.core.names import DRA_SCHEDULER_NAME
from gpushare_hub.extender.schedconfig import scheduler_config

from .conftest import CHART, Helm, StrictLoader

DRA_KUBE = "1.37.2"
ON = ("--set", "dra.enabled=true")
PACKED = (*ON, "--set", "dra.scheduler=gpushare")


def render(helm: Helm, *args: str, kube: str = DRA_KUBE, check: bool = True) -> Any:
    proc = helm.run(
        "template",
        "gpushare-hub",
        str(CHART),
        "--namespace=gpushare-hub",
        f"--kube-version={kube}",
        *args,
        check=check,
    )
    if not check:
        return proc
    return [d for d in yaml.load_all(proc.stdout, Loader=StrictLoader) if d]


def config_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "gpushare-scheduler-config"
    ]
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return cfg


def want(url: str, dra: str = "", tls: dict[str, str] | None = None) -> dict[str, Any]:
    cfg = scheduler_config(url, https=url.startswith("https"), tls_config=tls, dra_scheduler_name=dra)
    cfg["leaderElection"]["resourceNamespace"] = "gpushare-hub"
    return cfg


def test_default_leaves_dra_pods_to_the_default_scheduler(helm: Helm):
    cfg = config_of(render(helm, *ON))
    assert cfg == want("http://127.0.0.1:32766/gpushare-scheduler")
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["gpushare-scheduler"]
    assert config_of(render(helm, *ON, "--set", "dra.scheduler=default")) == cfg


def test_gpushare_adds_the_dra_profile_and_the_prioritize_only_entry(helm: Helm):
    cfg = config_of(render(helm, *PACKED))
    assert cfg == want("http://127.0.0.1:32766/gpushare-scheduler", DRA_SCHEDULER_NAME)
    assert [p["schedulerName"] for p in cfg["profiles"]] == ["gpushare-scheduler", DRA_SCHEDULER_NAME]
    binding = [e for e in cfg["extenders"] if "bindVerb" in e]
    assert len(binding) == 1 and "prioritizeVerb" not in binding[0]  # binpack: the scheduler scores


def test_gpushare_with_tls_gives_the_dra_entry_the_same_client_certificate(helm: Helm):
    tls = ("--set", "extender.tls.enabled=true", "--set", "extender.tls.existingSecret=ext-tls")
    cfg = config_of(render(helm, *PACKED, *tls))
    files = {
        "certFile": "/etc/gpushare-scheduler/tls/client.crt",
        "keyFile": "/etc/gpushare-scheduler/tls/client.key",
        "caFile": "/etc/gpushare-scheduler/tls/ca.crt",
        "serverName": "localhost",
    }
    assert cfg == want("https://127.0.0.1:32766/gpushare-scheduler", DRA_SCHEDULER_NAME, files)


def test_the_extender_may_read_claim_templates(helm: Helm):
    docs = render(helm, *PACKED)
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpushare-extender"]
    rules = [r for r in role["rules"] if "resourceclaimtemplates" in r["resources"]]
    assert rules and all(r["apiGroups"] == ["resource.k8s.io"] for r in rules)
    assert {v for r in rules for v in r["verbs"]} == {"get"}


def test_a_pinned_scheduler_of_1_36_or_newer_is_accepted(helm: Helm):
    cfg = config_of(render(helm, *PACKED, "--set", "scheduler.image.tag=v1.36.0"))
    assert DRA_SCHEDULER_NAME in [p["schedulerName"] for p in cfg["profiles"]]


@pytest.mark.parametrize(
    "extra,words",
    [
        (
            ("--set", "scheduler.image.tag=v1.35.3"),
            ["kube-scheduler 1.36 or newer", "kube-scheduler:v1.35.3"],
        ),
        (("--set", "scheduler.image.tag=latest"), ["scheduler.image.tag latest names no version"]),
    ],
    ids=["old-tag", "no-version"],
)
def test_gpushare_refuses_an_older_kube_scheduler_naming_it(helm: Helm, extra, words):
    proc = render(helm, *PACKED, *extra, check=False)
    assert proc.returncode != 0
    for word in words:
        assert word in proc.stderr, proc.stderr


def test_gpushare_without_dra_or_an_unknown_value_is_refused(helm: Helm):
    proc = render(helm, "--set", "dra.scheduler=gpushare", check=False)
    assert proc.returncode != 0 and "needs dra.enabled=true" in proc.stderr
    proc = render(helm, *ON, "--set", "dra.scheduler=spread", check=False)
    assert proc.returncode != 0 and "/dra/scheduler" in proc.stderr
