"""The examples stay true: they are what the code produces and reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpushare_hub.core import demand_from_pod
from gpushare_hub.extender.admission import Identities, admission_yaml
from gpushare_hub.extender.schedconfig import scheduler_config
from tests.objects import read_pod

EXAMPLES = Path(__file__).parents[2] / "examples"


def z2jh_stub(values: dict[str, Any]) -> Any:
    """Zero to JupyterHub's hub-side ``z2jh`` module as extraConfig uses it: ``get_config("a.b")``
    reads the chart's values (tests/chart/test_z2jh.py runs the chart's own module)."""
    import types

    def get_config(key: str, default: Any = None) -> Any:
        value: Any = values
        for level in key.split("."):
            if not isinstance(value, dict) or level not in value:
                return default
            value = value[level]
        return value

    module = types.ModuleType("z2jh")
    module.get_config = get_config  # type: ignore[attr-defined]
    return module


def test_scheduler_config_example_is_what_the_extender_prints():
    shipped = yaml.safe_load((EXAMPLES / "gpushare-scheduler-config.yaml").read_text())
    assert shipped == scheduler_config("http://127.0.0.1:32766/gpushare-scheduler")


def test_notebook_example_asks_a_5_gib_t4_slice():
    d = demand_from_pod(read_pod(yaml.safe_load((EXAMPLES / "notebook-5gib-pod.yaml").read_text())))
    assert d is not None and (d.per_card, d.count, d.models) == (5, 1, ("Tesla-T4",))


def test_admission_policy_example_is_what_the_extender_prints():
    shipped = (EXAMPLES / "gpushare-admission-policy.yaml").read_text()
    assert shipped == admission_yaml(Identities())
    kinds = [d["kind"] for d in yaml.safe_load_all(shipped)]
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 3


def test_printed_scheduler_config_carries_the_client_certificate_for_mutual_tls(capsys):
    from gpushare_hub.extender.app import GPUShareExtender

    app = GPUShareExtender()
    app.initialize(
        [
            "--print-scheduler-config",
            "--tls-cert=/etc/ext/tls.crt",
            "--tls-key=/etc/ext/tls.key",
            "--scheduler-client-cert=/etc/sched/client.crt",
            "--scheduler-client-key=/etc/sched/client.key",
            "--scheduler-ca=/etc/sched/extender-ca.crt",
        ]
    )
    app.start()
    (entry,) = yaml.safe_load(capsys.readouterr().out)["extenders"]
    assert entry["urlPrefix"].startswith("https://") and entry["enableHTTPS"] is True
    assert entry["tlsConfig"] == {
        "certFile": "/etc/sched/client.crt",
        "keyFile": "/etc/sched/client.key",
        "caFile": "/etc/sched/extender-ca.crt",
    }


def _load_config_file(path: Path) -> Any:
    from traitlets.config import Config

    c = Config()
    namespace: dict[str, Any] = {"get_config": lambda: c, "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return c, namespace


def test_hub_config_example_offers_the_t4_catalogue():
    from gpushare_hub import GPUShareSpawner

    c, _ = _load_config_file(EXAMPLES / "jupyterhub_config.py")  # runs check_config itself
    assert c.JupyterHub.spawner_class is GPUShareSpawner
    cat = GPUShareSpawner.check_config(c)
    sizes = {s.slug: (s.gib, s.cards, s.models) for s in cat.slices}
    assert sizes == {
        "t4-3g": (3, 1, ("Tesla-T4",)),
        "t4-5g": (5, 1, ("Tesla-T4",)),
        "t4-7g": (7, 1, ("Tesla-T4",)),
        "t4-whole": (None, 1, ("Tesla-T4",)),
    }
    assert cat.unknown_groups(c.JupyterHub.load_groups) == []
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert "admin:server_state" in roles["idle-culler"]["scopes"]  # the culler must see the slice
    # The hub service, with the spawner's catalogue, for the gpu-admins group.
    assert {s["name"] for s in c.JupyterHub.services} == {"idle-culler", "gpushare"}
    assert roles["gpushare-admins"]["groups"] == ["gpu-admins"]
    assert "custom:gpushare:admin" in c.JupyterHub.custom_scopes


def test_cull_arbiter_hook_culls_idle_gpu_servers_sooner():
    from datetime import timedelta

    from gpushare_hub.spawner.spawner import STATE_SLICE

    c, ns = _load_config_file(EXAMPLES / "idle_culler_config.py")
    hook = c.IdleCuller.cull_arbiter_hook
    gpu = {"name": "", "state": {STATE_SLICE: "t4-5g", "pod_name": "jupyter-alice"}}
    cpu = {"name": "", "state": {"pod_name": "jupyter-bob"}}
    idle = timedelta(seconds=ns["GPU_IDLE_LIMIT"] + 60)
    assert hook(inactive=idle, inactive_limit=3600, server=gpu) is True
    assert hook(inactive=idle, inactive_limit=3600, server=cpu) is False
    assert hook(inactive=timedelta(hours=2), inactive_limit=3600, server=cpu) is True
    assert hook(inactive=timedelta(minutes=1), inactive_limit=3600, server=gpu) is False
    assert hook(inactive=idle, inactive_limit=3600, server={"name": "x"}) is False  # no state scope


def test_the_examples_culler_flags_are_the_culler_2_flags_and_its_gpu_limit_can_be_set(monkeypatch):
    c, _ = _load_config_file(EXAMPLES / "jupyterhub_config.py")
    [culler] = [s for s in c.JupyterHub.services if s["name"] == "idle-culler"]
    flags = [f for f in culler["command"] if f.startswith("--")]
    assert not any(f.startswith("--config-file") for f in flags)  # 2.0 exits at once on it
    assert f"--config={EXAMPLES / 'idle_culler_config.py'}" in flags  # beside the hub's config
    monkeypatch.setenv("GPU_IDLE_LIMIT", "90")
    _, ns = _load_config_file(EXAMPLES / "idle_culler_config.py")
    assert ns["GPU_IDLE_LIMIT"] == 90


def test_z2jh_values_name_only_traits_the_spawner_has_and_pass_its_check(monkeypatch):
    import sys

    from traitlets.config import Config

    from gpushare_hub import GPUShareSpawner

    values = yaml.safe_load((EXAMPLES / "z2jh-values.yaml").read_text())
    monkeypatch.setitem(sys.modules, "z2jh", z2jh_stub(values))
    hub = values["hub"]
    settings = hub["config"]["GPUShareSpawner"]
    traits = GPUShareSpawner.class_traits(config=True)
    assert sorted(k for k in settings if k not in traits) == []
    c = Config()
    for key, value in settings.items():
        setattr(c.GPUShareSpawner, key, value)
    for code in hub["extraConfig"].values():
        exec(code, {"c": c})  # runs GPUShareSpawner.check_config(c)


def test_z2jh_values_run_the_hub_service_where_zero_to_jupyterhubs_proxy_reaches_it(monkeypatch):
    """The values' extraConfig, run as Zero to JupyterHub's jupyterhub_config.py runs it (in the hub's
    pod, the spawner's namespace from POD_NAMESPACE), adds the service at a port that the same
    file adds to the hub's Service and opens in the hub's NetworkPolicy; the service listens on it
    on every interface, in-cluster, and names only the spawner's namespace's pods after hub users."""
    import json
    import sys

    from traitlets.config import Config

    from gpushare_hub.service.app import GPUShareService
    from gpushare_hub.service.hubconfig import CONFIG_ENV

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    values = yaml.safe_load((EXAMPLES / "z2jh-values.yaml").read_text())
    monkeypatch.setitem(sys.modules, "z2jh", z2jh_stub(values))
    hub = values["hub"]
    c = Config()
    c.KubeSpawner.namespace = "jupyterhub"  # what Zero to JupyterHub sets before extraConfig
    for key, value in hub["config"]["GPUShareSpawner"].items():
        setattr(c.GPUShareSpawner, key, value)
    for _, code in sorted(hub["extraConfig"].items()):  # Zero to JupyterHub runs them sorted by key
        exec(code, {"c": c})
    (svc,) = [s for s in c.JupyterHub.services if s["name"] == "gpushare"]
    settings = json.loads(svc["environment"][CONFIG_ENV])["GPUShareService"]
    port = int(svc["url"].rsplit(":", 1)[1])
    assert svc["url"] == f"http://hub:{port}"  # the hub's Kubernetes Service, from the proxy's pod
    assert port == values["custom"]["gpushare"]["port"]  # the one place the port is written
    assert (settings["ip"], settings["port"]) == ("0.0.0.0", port)
    assert settings["in_cluster"] is True and settings["hub_namespaces"] == ["jupyterhub"]
    assert svc["environment"]["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"
    assert [p["port"] for p in hub["service"]["extraPorts"]] == [port]
    assert [p["targetPort"] for p in hub["service"]["extraPorts"]] == [port]
    (rule,) = hub["networkPolicy"]["ingress"]
    assert rule["ports"] == [{"port": port}]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"hub.jupyter.org/network-access-hub": "true"}}}]
    (egress,) = values["proxy"]["chp"]["networkPolicy"]["egress"]  # and the proxy may send there
    assert egress["ports"] == [{"port": port}]
    assert egress["to"] == [{"podSelector": {"matchLabels": {"component": "hub"}}}]
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles["gpushare-admins"]["groups"] == ["gpu-admins"]
    # The service reads those settings as it starts.
    monkeypatch.setenv(CONFIG_ENV, svc["environment"][CONFIG_ENV])
    app = GPUShareService()
    app.initialize([])
    assert (app.ip, app.port, app.hub_namespaces) == ("0.0.0.0", port, ["jupyterhub"])
