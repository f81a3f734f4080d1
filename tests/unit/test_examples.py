"""The examples stay true: they are what the code produces and reads."""

from __future__ import annotations

from pathlib import Path

import yaml

from extender.admission import Identities, admission_yaml
from extender.schedconfig import scheduler_config
from gpushare_hub.core import demand_from_pod

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_scheduler_config_example_is_what_the_extender_prints():
    shipped = yaml.safe_load((EXAMPLES / "gpushare-scheduler-config.yaml").read_text())
    assert shipped == scheduler_config("http://127.0.0.1:32766/gpushare-scheduler")


def test_notebook_example_asks_a_5_gib_t4_slice():
    d = demand_from_pod(yaml.safe_load((EXAMPLES / "notebook-5gib-pod.yaml").read_text()))
    assert d is not None and (d.per_card, d.count, d.models) == (5, 1, ("Tesla-T4",))


def test_admission_policy_example_is_what_the_extender_prints():
    shipped = (EXAMPLES / "gpushare-admission-policy.yaml").read_text()
    assert shipped == admission_yaml(Identities())
    kinds = [d["kind"] for d in yaml.safe_load_all(shipped)]
    assert kinds == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"] * 2


def test_printed_scheduler_config_carries_the_client_certificate_for_mutual_tls(capsys):
    from extender.app import GPUShareExtender

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
