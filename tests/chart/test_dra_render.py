"""The chart's DRA path (dra.enabled): what it renders, on which nodes, with which rights."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpushare_hub.core.cards import MODEL_MIB
from gpushare_hub.core.names import (
    DRA_CAPACITY,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    DRA_REQUEST,
    DRA_TEMPLATE_PREFIX,
)
from gpushare_hub.extender.admission import Identities, admission_manifests

from .conftest import CHART, EXAMPLES, Helm, StrictLoader

DRA_KUBE = "1.37.2"  # consumable capacity is on by default from 1.36
ON = ("--set", "dra.enabled=true")


def render(helm: Helm, *args: str, kube: str = DRA_KUBE) -> list[dict[str, Any]]:
    out = helm.run(
        "template", "gpushare-hub", str(CHART), "--namespace=gpushare-hub", f"--kube-version={kube}", *args
    )
    return [d for d in yaml.load_all(out.stdout, Loader=StrictLoader) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def pod_of(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (ds,) = find(docs, "DaemonSet", name)
    return dict(ds["spec"]["template"]["spec"])


def test_off_by_default_renders_nothing_of_dra_and_the_device_plugin_goes_everywhere(helm: Helm):
    docs = render(helm)
    assert not find(docs, "DaemonSet", "gpushare-dra-plugin")
    assert not find(docs, "DeviceClass") and not find(docs, "ResourceClaimTemplate")
    assert not [d for d in docs if "gpushare-dra-plugin" in json.dumps(d)]
    assert "affinity" not in pod_of(docs, "gpushare-device-plugin")


def test_on_renders_the_plugin_the_class_and_a_template_per_slice(helm: Helm):
    docs = render(helm, *ON)
    pod = pod_of(docs, "gpushare-dra-plugin")
    (container,) = pod["containers"]
    assert container["command"] == ["gpushare-dra-plugin"]
    args = container["args"]
    assert {
        "--node-name=$(NODE_NAME)",
        "--dra-plugin-dir=/var/lib/kubelet/plugins/gpushare-hub.io",
        "--registry-dir=/var/lib/kubelet/plugins_registry",
        "--memory-sizes=3Gi,5Gi,7Gi",
    } <= set(args)
    assert not [a for a in args if a.startswith(("--plugin-dir", "--resource-name", "--count-resource-name"))]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
    for name in ("dra-plugin", "plugins-registry"):
        assert mounts[name] == volumes[name]
    assert pod["serviceAccountName"] == "gpushare-dra-plugin"
    (cls,) = find(docs, "DeviceClass")
    assert cls["metadata"]["name"] == DRA_DEVICE_CLASS
    assert cls["spec"]["selectors"] == [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]
    templates = {t["metadata"]["name"]: t for t in find(docs, "ResourceClaimTemplate")}
    assert set(templates) == {f"{DRA_TEMPLATE_PREFIX}{s}" for s in ("t4-3g", "t4-5g", "t4-7g")}
    five = templates[f"{DRA_TEMPLATE_PREFIX}t4-5g"]
    assert five["metadata"]["namespace"] == "jupyterhub"
    (request,) = five["spec"]["spec"]["devices"]["requests"]
    assert request["name"] == DRA_REQUEST
    exactly = request["exactly"]
    assert (exactly["deviceClassName"], exactly["count"], exactly["allocationMode"]) == (
        DRA_DEVICE_CLASS,
        1,
        "ExactCount",
    )
    assert exactly["capacity"]["requests"] == {DRA_CAPACITY: "5Gi"}
    assert exactly["selectors"] == [
        {"cel": {"expression": f'device.attributes["{DRA_DRIVER}"].model in ["Tesla-T4"]'}}
    ]


def test_the_plugins_share_their_flags_and_host_folders(helm: Helm):
    """Everything the device plugin is told about cards, hook, CDI and driver, the DRA plugin is too."""
    docs = render(
        helm,
        *ON,
        "--set",
        "devicePlugin.runtimeClassName=nvidia",
        "--set",
        "devicePlugin.driverRoot=/run/nvidia/driver",
    )
    dp, dra = pod_of(docs, "gpushare-device-plugin"), pod_of(docs, "gpushare-dra-plugin")
    own = (
        "--node-name",
        "--plugin-dir",
        "--resource-name",
        "--count-resource-name",
        "--dra-plugin-dir",
        "--registry-dir",
        "--memory-sizes",
    )
    shared = [a for a in dp["containers"][0]["args"] if not a.startswith(own)]
    assert shared == [a for a in dra["containers"][0]["args"] if not a.startswith(own)]
    assert "--driver-root=/run/nvidia/driver" in shared
    assert dp["runtimeClassName"] == dra["runtimeClassName"] == "nvidia"
    assert dp["containers"][0]["env"] == dra["containers"][0]["env"]
    dp_volumes = [v for v in dp["volumes"] if v["name"] != "device-plugins"]
    assert dp_volumes == [v for v in dra["volumes"] if v["name"] not in ("dra-plugin", "plugins-registry")]


@pytest.mark.parametrize(
    "selector", [{"gpushare-hub.io/dra": "true"}, {"pool": "dra", "gpu": "t4"}], ids=["default", "two-labels"]
)
def test_a_node_is_served_by_one_path(helm: Helm, selector: dict[str, str]):
    # null drops the default label (helm merges maps)
    given = {"gpushare-hub.io/dra": None, **selector}
    docs = render(helm, *ON, "--set-json", f"dra.nodeSelector={json.dumps(given)}")
    dra = pod_of(docs, "gpushare-dra-plugin")
    assert dra["nodeSelector"] == selector
    dp = pod_of(docs, "gpushare-device-plugin")
    terms = dp["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]

    def device_plugin_runs_on(labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in dp["nodeSelector"].items()):
            return False
        return any(
            all(
                (labels.get(e["key"]) not in e["values"]) if e["operator"] == "NotIn" else False
                for e in term["matchExpressions"]
            )
            for term in terms
        )

    gpu = {"gpushare": "true"}
    assert device_plugin_runs_on(gpu)
    assert not device_plugin_runs_on({**gpu, **selector})
    for key in selector:  # a node with only some of the DRA labels is not a DRA node
        partial = {**gpu, **{k: v for k, v in selector.items() if k != key}}
        assert device_plugin_runs_on(partial)


def rules_of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    (role,) = find(docs, kind, "gpushare-dra-plugin")
    return list(role["rules"])


def test_the_dra_plugins_rights_are_exactly_these(helm: Helm):
    docs = render(helm, *ON)
    cluster = sorted(rules_of(docs, "ClusterRole"), key=repr)
    assert cluster == sorted(
        [
            {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceslices"],
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
            },
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
            # the usage loop and the self-test: the node's pods; Warning events
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "list"]},
        ],
        key=repr,
    )
    assert rules_of(docs, "Role") == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "verbs": ["get"],
            "resourceNames": ["gpushare-node-options"],
        }
    ]
    (binding,) = find(docs, "ClusterRoleBinding", "gpushare-dra-plugin")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpushare-dra-plugin", "namespace": "gpushare-hub"}
    ]


def test_with_dra_the_node_policy_lets_the_dra_plugin_publish_its_cards(helm: Helm):
    docs = render(helm, *ON)
    ours = {"gpushare-hub-pods", "gpushare-hub-nodes", "gpushare-hub-pod-runtime"}
    rendered = [
        d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy") and d["metadata"]["name"] in ours
    ]
    want = admission_manifests(
        Identities(
            extender=("system:serviceaccount:gpushare-hub:gpushare-extender",),
            plugin=(
                "system:serviceaccount:gpushare-hub:gpushare-device-plugin",
                "system:serviceaccount:gpushare-hub:gpushare-dra-plugin",
            ),
        )
    )
    assert sorted(rendered, key=repr) == sorted(want, key=repr)
    shipped = list(yaml.safe_load_all((EXAMPLES / "gpushare-admission-policy.yaml").read_text()))
    assert sorted(rendered, key=repr) != sorted(shipped, key=repr)


def test_the_dra_admission_policies_come_with_dra_and_admission(helm: Helm):
    names = {
        "gpushare-hub-resourceslices",
        "gpushare-hub-resourceclaims",
        "gpushare-hub-resourceclaimtemplates",
    }
    on = {d["metadata"]["name"] for d in render(helm, *ON) if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert names <= on
    off = render(helm, *ON, "--set", "admission.enabled=false")
    assert not [d for d in off if d["kind"].startswith("ValidatingAdmissionPolicy")]


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        (
            ["--set", "dra.slices[0].slug=T4_3G", "--set", "dra.slices[0].gib=3"],
            ["/dra/slices/0/slug", "pattern"],
        ),
        (["--set", "dra.slices[0].slug=a", "--set", "dra.slices[0].gib=0"], ["/dra/slices/0/gib", "minimum"]),
        (
            [
                "--set",
                "dra.slices[0].slug=a",
                "--set",
                f"dra.slices[0].gib={max(MODEL_MIB.values()) // 1024 + 1}",
            ],
            ["/dra/slices/0/gib", "maximum"],
        ),
        (
            [
                "--set",
                "dra.slices[0].slug=a",
                "--set",
                "dra.slices[0].gib=3",
                "--set",
                'dra.slices[0].models[0]=T4"',
            ],
            ["/dra/slices/0/models/0", "pattern"],
        ),
        (["--set", "dra.slices[0].gib=3"], ["/dra/slices/0", "slug"]),
    ],
    ids=["slug", "zero-gib", "larger-than-any-card", "cel-quote", "no-slug"],
)
def test_the_schema_refuses_bad_slices_naming_them(helm: Helm, setting, words):
    proc = helm.run("template", "x", str(CHART), f"--kube-version={DRA_KUBE}", *ON, *setting, check=False)
    assert proc.returncode != 0 and "values don't meet the specifications of the schema" in proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def test_a_slug_twice_or_an_old_cluster_stops_the_install_naming_why(helm: Helm):
    twice = '[{"slug": "a", "gib": 3}, {"slug": "a", "gib": 5}]'
    proc = helm.run(
        "template",
        "x",
        str(CHART),
        f"--kube-version={DRA_KUBE}",
        *ON,
        "--set-json",
        f"dra.slices={twice}",
        check=False,
    )
    assert proc.returncode != 0 and "the slug a is there twice" in proc.stderr
    old = helm.run("template", "x", str(CHART), "--kube-version=1.35.4", *ON, check=False)
    assert old.returncode != 0 and "1.36" in old.stderr and "v1.35.4" in old.stderr


def test_sizes_are_given_once_each_in_numeric_order(helm: Helm):
    slices = [{"slug": "big", "gib": 12}, {"slug": "a", "gib": 5}, {"slug": "b", "gib": 5, "models": ["A10"]}]
    docs = render(helm, *ON, "--set-json", f"dra.slices={json.dumps(slices)}")
    (container,) = pod_of(docs, "gpushare-dra-plugin")["containers"]
    assert "--memory-sizes=5Gi,12Gi" in container["args"]
    templates = {t["metadata"]["name"]: t for t in find(docs, "ResourceClaimTemplate")}
    assert (
        "selectors"
        not in templates[f"{DRA_TEMPLATE_PREFIX}a"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    )


def test_the_dra_plugins_command_line_takes_the_rendered_arguments(helm: Helm):
    from gpushare_hub.plugin.dra.app import GPUShareDRAPlugin

    docs = render(helm, *ON, "--set-json", 'devicePlugin.simulate="1x Tesla T4:15360"')
    (container,) = pod_of(docs, "gpushare-dra-plugin")["containers"]
    app = GPUShareDRAPlugin()
    app.parse_command_line([a.replace("$(NODE_NAME)", "gpu-1") for a in container["args"]])
    assert (app.node_name, app.memory_sizes, app.backend) == ("gpu-1", "3Gi,5Gi,7Gi", "simulated")
    assert (app.dra_plugin_dir, app.registry_dir) == (
        "/var/lib/kubelet/plugins/gpushare-hub.io",
        "/var/lib/kubelet/plugins_registry",
    )
