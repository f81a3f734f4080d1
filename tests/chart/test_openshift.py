"""docs/openshift.md: its helm template command, run as written, renders pods that each fit the SCC
the page grants their ServiceAccount (restricted-v2 where it grants none).

The SCCs are OpenShift's defaults, reduced to what decides admission for these pods: host
folders, host PIDs, privileged containers, and who picks the UID (restricted-v2 assigns one
from the namespace's range, so a pod may neither fix it nor rely on the image's root).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from tests.doccommands import NOT_RUN, all_blocks, doc_block, option

from .conftest import EXAMPLES, KUBE_VERSION, Helm, StrictLoader
from .docrun import run_block


@dataclass(frozen=True)
class SCC:
    host_path: bool
    host_pid: bool
    privileged: bool
    any_uid: bool  # RunAsAny: a fixed UID, or the image's own (root)


SCCS = {
    "restricted-v2": SCC(host_path=False, host_pid=False, privileged=False, any_uid=False),
    "hostmount-anyuid": SCC(host_path=True, host_pid=False, privileged=False, any_uid=True),
    "hostaccess": SCC(host_path=True, host_pid=True, privileged=False, any_uid=False),
    "privileged": SCC(host_path=True, host_pid=True, privileged=True, any_uid=True),
}


def needs(pod: dict[str, Any]) -> SCC:
    """What a pod template asks of its SCC."""
    ctx = pod.get("securityContext") or {}
    containers = pod.get("containers", []) + pod.get("initContainers", [])
    fixed = (
        "runAsUser" in ctx
        or "runAsGroup" in ctx
        or any("runAsUser" in (c.get("securityContext") or {}) for c in containers)
    )
    non_root = ctx.get("runAsNonRoot") is True or all(
        (c.get("securityContext") or {}).get("runAsNonRoot") is True for c in containers
    )
    return SCC(
        host_path=any("hostPath" in v for v in pod.get("volumes", [])),
        host_pid=bool(pod.get("hostPID")),
        privileged=any((c.get("securityContext") or {}).get("privileged") for c in containers),
        any_uid=fixed or not non_root,
    )


def allows(scc: SCC, need: SCC) -> bool:
    return all(
        getattr(scc, f) or not getattr(need, f) for f in ("host_path", "host_pid", "privileged", "any_uid")
    )


def granted() -> dict[tuple[str, str], str]:
    """(namespace, ServiceAccount) -> SCC, from the page's `oc adm policy add-scc-to-user` commands."""
    (block,) = [b for b in all_blocks() if b.mark == NOT_RUN and b.doc.name == "openshift.md"]
    out = {}
    for argv in block.commands():
        assert argv[:4] == ["oc", "adm", "policy", "add-scc-to-user"], argv
        (sa,), (ns,) = option(argv, "-z"), option(argv, "-n")
        out[(ns, sa)] = argv[4]
    return out


def rendered(helm: Helm) -> list[dict[str, Any]]:
    (out,) = run_block(
        doc_block("openshift-template"), helm.binary, None, {"<kubernetes-version>": KUBE_VERSION}
    )
    return [d for d in yaml.load_all(out, Loader=StrictLoader) if d]


def test_every_pod_fits_the_scc_the_openshift_page_grants_its_service_account(helm: Helm):
    grants = granted()
    checked = {}
    for doc in rendered(helm):
        if doc["kind"] not in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            continue
        pod = doc["spec"]["template"]["spec"]
        key = (doc["metadata"]["namespace"], pod.get("serviceAccountName", "default"))
        scc = grants.get(key, "restricted-v2")
        assert scc in SCCS, f"{key}: unknown SCC {scc}"
        assert allows(SCCS[scc], needs(pod)), (
            f"{doc['kind']}/{doc['metadata']['name']} needs {needs(pod)}, {scc} allows {SCCS[scc]}"
        )
        checked[doc["metadata"]["name"]] = scc
    # The page's table: the scheduler under restricted-v2, the plugin and the MPS daemons privileged.
    assert checked == {
        "gpushare-scheduler": "restricted-v2",
        "gpushare-device-plugin": "privileged",
        "gpushare-mps-control-daemon": "privileged",
        "gpushare-mps-control-daemon-multi-user": "privileged",
    }
    # Each grant is used: no SCC is handed to an account nothing runs as.
    used = {
        (d["metadata"]["namespace"], d["spec"]["template"]["spec"].get("serviceAccountName"))
        for d in rendered(helm)
        if d["kind"] in ("Deployment", "DaemonSet")
    }
    assert set(grants) <= used


def test_the_scheduler_has_no_fixed_uid_and_the_default_values_would_need_one(helm: Helm):
    """Without the page's values file, the chart's fixed UID 65532 would not pass restricted-v2."""
    (scheduler,) = [d for d in rendered(helm) if d["kind"] == "Deployment"]
    ctx = scheduler["spec"]["template"]["spec"]["securityContext"]
    assert "runAsUser" not in ctx and "runAsGroup" not in ctx and ctx["runAsNonRoot"] is True
    (default,) = [d for d in helm.template() if d["kind"] == "Deployment"]
    assert not allows(SCCS["restricted-v2"], needs(default["spec"]["template"]["spec"]))


def test_the_device_plugin_would_not_fit_restricted_v2_or_hostmount_anyuid_with_usage_readings(helm: Helm):
    """Why the page grants privileged and names hostmount-anyuid only without usage readings (hostPID)."""
    (plugin,) = [
        d
        for d in rendered(helm)
        if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "gpushare-device-plugin"
    ]
    need = needs(plugin["spec"]["template"]["spec"])
    assert not allows(SCCS["restricted-v2"], need) and not allows(SCCS["hostmount-anyuid"], need)
    quiet = [
        d
        for d in helm.template(
            f"--values={EXAMPLES / 'gpushare-hub-values-openshift.yaml'}",
            "--set=devicePlugin.usageInterval=0",
        )
        if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "gpushare-device-plugin"
    ]
    assert allows(SCCS["hostmount-anyuid"], needs(quiet[0]["spec"]["template"]["spec"]))
