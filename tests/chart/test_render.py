"""The chart renders what the code generates: lint, template, schema, and the one-source files."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from gpushare_hub.extender.admission import Identities, admission_manifests
from gpushare_hub.extender.rbac import RULES as EXTENDER_RULES
from gpushare_hub.extender.schedconfig import scheduler_config
from gpushare_hub.plugin.kube import RBAC_RULES as PLUGIN_RULES

from .conftest import CHART, CHART_EXAMPLES, EXAMPLES, KUBE_VERSION, Helm, StrictLoader, generator


def by_kind(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = by_kind(docs, kind, name)
    return doc


def test_generated_files_are_what_their_sources_give():
    assert generator().stale() == [], "run `make chart` and commit the result"


def scheduler_image(helm: Helm, kube_version: str, *args: str) -> str:
    out = helm.run("template", "x", str(CHART), f"--kube-version={kube_version}", *args)
    docs = [d for d in yaml.load_all(out.stdout, Loader=StrictLoader) if d]
    pod = one(docs, "Deployment", "gpushare-scheduler")["spec"]["template"]["spec"]
    (image,) = [c["image"] for c in pod["containers"] if c["name"] == "kube-scheduler"]
    return str(image)


def test_by_default_kube_scheduler_is_the_clusters_own_version():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["scheduler"]["image"] == {
        "repository": "registry.k8s.io/kube-scheduler",
        "tag": "",
        "pullPolicy": "IfNotPresent",
    }


@pytest.mark.parametrize(
    ("kube_version", "tag"),
    [
        (KUBE_VERSION, KUBE_VERSION),  # the harness's cluster runs the scheduler it built
        ("1.30.0", "v1.30.0"),
        ("v1.37.2", "v1.37.2"),
        ("v1.31.4+k3s1", "v1.31.4"),
        ("1.32.5-eks-adc7111", "v1.32.5"),
        ("v1.33.1-gke.1200000", "v1.33.1"),
    ],
    ids=["harness", "plain", "leading-v", "k3s", "eks", "gke"],
)
def test_an_empty_tag_names_the_upstream_scheduler_of_the_clusters_release(helm: Helm, kube_version, tag):
    assert scheduler_image(helm, kube_version) == f"registry.k8s.io/kube-scheduler:{tag}"


def test_a_set_scheduler_tag_and_repository_win_over_the_clusters_version(helm: Helm):
    image = scheduler_image(
        helm,
        "v1.31.4+k3s1",
        "--set",
        "scheduler.image.tag=v1.30.9",
        "--set",
        "scheduler.image.repository=mirror.example.org/kube-scheduler",
    )
    assert image == "mirror.example.org/kube-scheduler:v1.30.9"


def test_there_is_an_example_values_file_to_lint():
    assert CHART_EXAMPLES, "examples/gpushare-hub-values*.yaml"


@pytest.mark.parametrize("values", [None, *CHART_EXAMPLES], ids=lambda p: p.name if p else "defaults")
def test_lint_and_template_pass_on_defaults_and_every_example(helm: Helm, values):
    args = [f"--values={values}"] if values else []
    lint = helm.run("lint", "--strict", str(CHART), f"--kube-version={KUBE_VERSION}", *args)
    assert "0 chart(s) failed" in lint.stdout
    kinds = {d["kind"] for d in helm.template(*args)}
    assert {"Deployment", "DaemonSet", "ConfigMap", "ClusterRole", "ValidatingAdmissionPolicy"} <= kinds


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        (["--set", "scheduler.replicas=two"], ["/scheduler/replicas", "integer"]),
        (["--set", "scheduler.replica=2"], ["/scheduler", "replica"]),
        (["--set", "policy=fastest"], ["/policy", "binpack"]),
        (["--set", "admission.adminGroups[0]=x' || true || 'y"], ["/admission/adminGroups/0", "pattern"]),
        (["--set", "extender.tls.enabled=true"], ["/extender/tls", "existingSecret"]),
        (["--set", "scheduler.image.tag=v1.34.4 --v=9"], ["/scheduler/image/tag", "pattern"]),
        (["--set-string", "devicePlugin.simulate=Tesla T4"], ["/devicePlugin/simulate", "pattern"]),
        (["--set-string", "devicePlugin.simulate=1x T4:"], ["/devicePlugin/simulate", "pattern"]),
        (["--set", "devicePlugin.deviceMode=nvml"], ["/devicePlugin/deviceMode", "legacy"]),
    ],
    ids=[
        "wrong-type",
        "unknown-key",
        "unknown-policy",
        "cel-injection",
        "tls-without-secret",
        "scheduler-tag",
        "simulate-no-count",
        "simulate-no-mib",
        "unknown-device-mode",
    ],
)
def test_the_schema_refuses_bad_values_naming_the_key(helm: Helm, setting, words):
    proc = helm.run("template", "x", str(CHART), f"--kube-version={KUBE_VERSION}", *setting, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def rendered_scheduler_config(docs: list[dict[str, Any]]) -> dict[str, Any]:
    cm = one(docs, "ConfigMap", "gpushare-scheduler-config")
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return cfg


@pytest.mark.parametrize("policy", ["binpack", "spread", "fgd", "strand"])
@pytest.mark.parametrize("tls", [False, True])
def test_scheduler_config_is_what_the_extender_prints_for_the_same_values(helm: Helm, policy, tls):
    args = [
        "--set",
        f"policy={policy}",
        "--set",
        "schedulerName=gpu-sched",
        "--set",
        "resource.name=example.com/vram",
    ]
    if tls:
        args += ["--set", "extender.tls.enabled=true", "--set", "extender.tls.existingSecret=ext-tls"]
    got = rendered_scheduler_config(helm.template(*args, namespace="gpu-system"))
    scheme = "https" if tls else "http"
    tls_config = (
        {
            "certFile": "/etc/gpushare-scheduler/tls/client.crt",
            "keyFile": "/etc/gpushare-scheduler/tls/client.key",
            "caFile": "/etc/gpushare-scheduler/tls/ca.crt",
            "serverName": "localhost",
        }
        if tls
        else None
    )
    want = scheduler_config(
        f"{scheme}://127.0.0.1:32766/gpushare-scheduler",
        "gpu-sched",
        "example.com/vram",
        https=tls,
        policy=policy,
        tls_config=tls_config,
    )
    want["leaderElection"]["resourceNamespace"] = "gpu-system"  # the Lease lives with the release
    assert got == want


def test_the_extender_sidecar_gets_the_certificates_the_scheduler_config_names(helm: Helm):
    docs = helm.template("--set", "extender.tls.enabled=true", "--set", "extender.tls.existingSecret=ext-tls")
    pod = one(docs, "Deployment", "gpushare-scheduler")["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    args = containers["extender"]["args"]
    assert "--ip=127.0.0.1" in args
    assert {
        "--tls-client-ca=/etc/gpushare-extender/tls/ca.crt",
        "--tls-cert=/etc/gpushare-extender/tls/tls.crt",
    } <= set(args)
    mounts = {m["mountPath"]: m["name"] for m in containers["kube-scheduler"]["volumeMounts"]}
    assert mounts["/etc/gpushare-scheduler/tls"] == "tls"
    assert {"name": "tls", "secret": {"secretName": "ext-tls"}} in pod["volumes"]


def test_admission_policy_with_default_identities_is_the_shipped_example(helm: Helm):
    docs = helm.template()
    rendered = [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")]
    shipped = list(yaml.safe_load_all((EXAMPLES / "gpushare-admission-policy.yaml").read_text()))
    assert sorted(rendered, key=repr) == sorted(shipped, key=repr)


def test_admission_policy_follows_the_namespace_admins_and_policy_setters(helm: Helm):
    docs = helm.template(
        "--set",
        "admission.adminGroups={system:masters,gpu-admins}",
        "--set",
        "admission.policySetters={system:serviceaccount:jhub:hub}",
        namespace="gpu-system",
    )
    rendered = [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")]
    want = admission_manifests(
        Identities(
            extender=("system:serviceaccount:gpu-system:gpushare-extender",),
            plugin=("system:serviceaccount:gpu-system:gpushare-device-plugin",),
            admin_groups=("system:masters", "gpu-admins"),
            policy_setters=("system:serviceaccount:jhub:hub",),
            exempt_namespaces=("gpu-system", "kube-system", "gpu-operator"),
        )
    )
    assert sorted(rendered, key=repr) == sorted(want, key=repr)


def test_the_pod_runtime_policy_exempts_the_release_and_names_our_runtime_classes(helm: Helm):
    """The release's namespace comes first and once; devicePlugin's and mps' RuntimeClasses join
    admission.runtimeClasses (the plugin's pods are exempt by namespace, users' are refused them)."""
    docs = helm.template(
        "--set", "admission.exemptNamespaces={kube-system,gpu-system}",
        "--set", "devicePlugin.runtimeClassName=nvidia",
        "--set", "mps.runtimeClassName=nvidia-mps",
        namespace="gpu-system",
    )  # fmt: skip
    policy = one(docs, "ValidatingAdmissionPolicy", "gpushare-hub-pod-runtime")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["exemptNamespaces"] == "['gpu-system', 'kube-system']"
    assert variables["runtimeClasses"] == "['nvidia', 'nvidia-cdi', 'nvidia-legacy', 'nvidia-mps']"


def test_admission_policy_can_be_left_out(helm: Helm):
    docs = helm.template("--set", "admission.enabled=false")
    assert not [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")]


def strip_names(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "resourceNames"} for r in rules]


@pytest.mark.parametrize(
    ("identity", "source"), [("gpushare-extender", EXTENDER_RULES), ("gpushare-device-plugin", PLUGIN_RULES)]
)
def test_rbac_is_the_codes_rules_split_between_cluster_and_namespace(helm: Helm, identity, source):
    docs = helm.template()
    cluster = one(docs, "ClusterRole", identity)["rules"]
    local = one(docs, "Role", identity)["rules"]
    assert sorted(strip_names(cluster + local), key=repr) == sorted(source, key=repr)
    assert all(set(r["resources"]) & {"configmaps", "leases"} for r in local)


def test_device_plugin_runs_on_gpushare_nodes_with_the_kubelet_folder_and_its_node_name(helm: Helm):
    docs = helm.template("--set", "devicePlugin.runtimeClassName=nvidia")
    pod = one(docs, "DaemonSet", "gpushare-device-plugin")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpushare": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (container,) = pod["containers"]
    assert "--node-name=$(NODE_NAME)" in container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert pod["volumes"][0]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"


def test_node_options_reach_the_plugins_configmap_as_json(helm: Helm):
    docs = helm.template("--set-json", 'devicePlugin.nodeOptions={"default": {"reserveFraction": 0.05}}')
    cm = one(docs, "ConfigMap", "gpushare-node-options")
    assert yaml.safe_load(cm["data"]["default"]) == {"reserveFraction": 0.05}


def test_openshift_can_leave_the_schedulers_uid_to_the_platform(helm: Helm):
    default = one(helm.template(), "Deployment", "gpushare-scheduler")["spec"]["template"]["spec"]
    assert default["securityContext"]["runAsUser"] == 65532
    docs = helm.template(
        "--set",
        "scheduler.podSecurityContext.runAsUser=null",
        "--set",
        "scheduler.podSecurityContext.runAsGroup=null",
    )
    pod = one(docs, "Deployment", "gpushare-scheduler")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def test_a_service_monitor_only_where_the_prometheus_operator_is(helm: Helm):
    assert not by_kind(helm.template(), "ServiceMonitor")
    docs = helm.template("--api-versions=monitoring.coreos.com/v1/ServiceMonitor")
    monitor = one(docs, "ServiceMonitor", "gpushare-extender")
    service = one(docs, "Service", "gpushare-extender-metrics")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "metrics"
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "scheduler"


def test_node_options_in_the_schema_are_the_ones_the_plugin_reads():
    from gpushare_hub.plugin.nodeconfig import KNOWN

    schema = yaml.safe_load((CHART / "values.schema.yaml").read_text())
    options = schema["properties"]["devicePlugin"]["properties"]["nodeOptions"]["additionalProperties"]
    assert set(options["properties"]) == KNOWN


def test_the_plugin_fills_the_hook_folder_at_the_host_path_and_reads_processes_with_host_pid(helm: Helm):
    pod = one(helm.template(), "DaemonSet", "gpushare-device-plugin")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert "--hook-host-path=/var/lib/gpushare-hub/pyhook" in container["args"]
    assert (
        mounts["pyhook"]["mountPath"]
        == volumes["pyhook"]["hostPath"]["path"]
        == "/var/lib/gpushare-hub/pyhook"
    )
    assert mounts["mps"]["mountPath"] == volumes["mps"]["hostPath"]["path"] == "/run/gpushare-hub/mps"
    assert pod["hostPID"] is True
    quiet = one(
        helm.template("--set", "devicePlugin.usageInterval=0", "--set", "devicePlugin.hookHostPath="),
        "DaemonSet",
        "gpushare-device-plugin",
    )["spec"]["template"]["spec"]
    assert "hostPID" not in quiet and "pyhook" not in {v["name"] for v in quiet["volumes"]}


def plugin_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(docs, "DaemonSet", "gpushare-device-plugin")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return dict(container)


def test_by_default_the_plugin_reads_the_cards_through_the_nvidia_runtime(helm: Helm):
    container = plugin_container(helm.template())
    assert not [a for a in container["args"] if a.startswith(("--backend", "--simulate"))]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


@pytest.mark.parametrize("cards", ["1x Tesla T4:15360", "2x Tesla T4:15360, 1x A10"])
def test_simulate_runs_the_plugins_simulated_backend_on_the_declared_cards(helm: Helm, cards):
    """The rendered arguments, read by the plugin's own command line, give the declared cards."""
    from gpushare_hub.plugin.app import GPUShareDevicePlugin
    from gpushare_hub.plugin.backends import SimulatedBackend

    container = plugin_container(helm.template("--set-json", f"devicePlugin.simulate={json.dumps(cards)}"))
    assert container["args"][-2:] == ["--backend=simulated", f"--simulate={cards}"]
    assert {e["name"] for e in container["env"]} == {"NODE_NAME"}  # no NVIDIA runtime asked for
    app = GPUShareDevicePlugin()
    app.parse_command_line([a.replace("$(NODE_NAME)", "gpu-1") for a in container["args"]])
    assert (app.backend, app.simulate, app.node_name) == ("simulated", cards, "gpu-1")
    assert isinstance(app.make_backend(), SimulatedBackend)


@pytest.mark.parametrize(
    "cards", ["1x Tesla T4:15360", "2x Tesla T4", " 1 × A10 , 3X A100-80GB:81920", "4x Tesla-T4:15360"]
)
def test_the_simulate_pattern_accepts_what_the_plugin_reads(cards):
    import re

    from gpushare_hub.core.declarations import parse_card_groups

    parse_card_groups(cards, flag="--simulate")  # the plugin accepts it
    schema = yaml.safe_load((CHART / "values.schema.yaml").read_text())
    pattern = schema["properties"]["devicePlugin"]["properties"]["simulate"]["pattern"]
    assert re.match(pattern, cards)


def test_the_plugin_writes_its_cdi_spec_where_the_runtime_reads_and_reads_the_host_read_only(helm: Helm):
    pod = one(helm.template(), "DaemonSet", "gpushare-device-plugin")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    args = container["args"]
    assert {"--device-mode=auto", "--cdi-dir=/var/run/cdi", "--host-root=/host", "--driver-root=/"} <= set(
        args
    )
    assert mounts["cdi"]["mountPath"] == volumes["cdi"]["hostPath"]["path"] == "/var/run/cdi"
    assert "readOnly" not in mounts["cdi"]  # the spec is written there
    assert mounts["host-root"] == {"name": "host-root", "mountPath": "/host", "readOnly": True}
    assert volumes["host-root"]["hostPath"] == {"path": "/", "type": "Directory"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True and "tmp" in mounts
    operator = plugin_container(
        helm.template(
            "--set", "devicePlugin.driverRoot=/run/nvidia/driver", "--set", "devicePlugin.deviceMode=cdi"
        )
    )
    assert {"--device-mode=cdi", "--driver-root=/run/nvidia/driver"} <= set(operator["args"])
    legacy = one(
        helm.template("--set", "devicePlugin.deviceMode=legacy"), "DaemonSet", "gpushare-device-plugin"
    )
    spec = legacy["spec"]["template"]["spec"]
    assert "host-root" not in {v["name"] for v in spec["volumes"]}  # nothing of the host to read
    assert not any(a.startswith("--host-root") for a in spec["containers"][0]["args"])


def test_our_images_default_to_the_charts_app_version_and_a_set_tag_wins(helm: Helm):
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]

    def images(*args: str) -> dict[str, str]:
        docs = helm.template(*args)
        scheduler = one(docs, "Deployment", "gpushare-scheduler")["spec"]["template"]["spec"]
        plugin = one(docs, "DaemonSet", "gpushare-device-plugin")["spec"]["template"]["spec"]
        found = {c["name"]: c["image"] for c in scheduler["containers"]}
        found.update({c["name"]: c["image"] for c in plugin["containers"]})
        return found

    default = images()
    assert default["extender"] == f"ghcr.io/gpushare-hub/gpushare-extender:{app_version}"
    assert default["device-plugin"] == f"ghcr.io/gpushare-hub/gpushare-device-plugin:{app_version}"
    pinned = images("--set", "extender.image.tag=0.0.9", "--set", "devicePlugin.image.repository=reg.lab/dp")
    assert pinned["extender"].endswith(":0.0.9") and pinned["device-plugin"] == f"reg.lab/dp:{app_version}"


@pytest.mark.parametrize("version", ["1.29.9", "1.38.0"])
def test_a_kubernetes_version_outside_the_support_matrix_stops_the_install_naming_it(
    helm: Helm, version: str
):
    proc = helm.run("template", "gpushare-hub", str(CHART), f"--kube-version={version}", check=False)
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr and version in proc.stderr, proc.stderr


def test_the_tested_kubernetes_versions_are_inside_the_charts_range(helm: Helm):
    from gpushare_hub.localcluster.build import Versions

    for v in Versions.all():
        helm.run("template", "gpushare-hub", str(CHART), f"--kube-version={v.kubernetes}")
