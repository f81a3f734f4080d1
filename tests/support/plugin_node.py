"""The kubelet tier's device-plugin node ``NODE``: pods sent to it through our scheduler
(``SCHED``, ``SELECTOR``), the node's annotations, a pod once bound with the extender's record and
the card it names (``bound_pod``, ``placed``, ``chosen_card``), and the node emptied of pods."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gpushare_hub.core.names import ALLOCATION_ANNOTATION
from gpushare_hub.localcluster.cluster import LocalCluster
from gpushare_hub.localcluster.processes import Component
from gpushare_hub.plugin.kube import RBAC_RULES
from tests.conftest import wait_for

NODE = "dp-node"
SCHED = "gpushare-scheduler"
SELECTOR = {"test-group": NODE}


def node_annotations(cluster) -> dict:
    return cluster.core_api().read_node(NODE).metadata.annotations


def bound_pod(cluster, namespace, name, timeout=90) -> dict | None:
    def get():
        pod = cluster.get_json(f"/api/v1/namespaces/{namespace}/pods/{name}")
        ok = pod["spec"].get("nodeName") and ALLOCATION_ANNOTATION in (
            pod["metadata"].get("annotations") or {}
        )
        return pod if ok else None

    return wait_for(get, timeout=timeout)


def chosen_card(pod: dict) -> str:
    return json.loads(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])["cards"][0]["uuid"]


def empty_node(cluster, device_manager) -> None:
    """No pod on the node, in the API server and in the device manager (their devices are free)."""
    assert device_manager.call("forget") == {"ok": True}
    api = cluster.core_api()
    for p in api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items:
        api.delete_namespaced_pod(p.metadata.name, p.metadata.namespace, grace_period_seconds=0)
    assert wait_for(lambda: not api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE}").items)


def placed(cluster, namespace: str, name: str) -> dict[str, Any] | None:
    pod = cluster.get_json(f"/api/v1/namespaces/{namespace}/pods/{name}")
    ok = pod["spec"].get("nodeName") and ALLOCATION_ANNOTATION in (pod["metadata"].get("annotations") or {})
    return pod if ok else None


# The kubelet's folder of device plugins (the kubelet tier's device manager serves there).
PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")


class Plugin:
    """Our plugin (simulated cards) on ``node``, serving in ``plugin_dir`` (the kubelet's folder
    unless a test gives its own); ``name`` is its component and log name."""

    def __init__(
        self,
        cluster: LocalCluster,
        health_file: Path,
        node: str = NODE,
        plugin_dir: Path = PLUGIN_DIR,
        name: str = "gpushare-device-plugin",
    ) -> None:
        self.cluster = cluster
        self.health_file = health_file
        self.node, self.plugin_dir, self.name = node, plugin_dir, name
        self.hook_dir = health_file.parent / "pyhook"  # the node's host folder for the start-up hook
        self.kubeconfig = self._credentials()
        self.comp: Component | None = None

    def _credentials(self) -> Path:
        self.cluster.grant("gpushare-device-plugin", RBAC_RULES)
        return self.cluster.credential("user-device-plugin", "gpushare-device-plugin")

    def start(self, *extra: str) -> None:
        if not any(a.startswith("--cdi-dir=") for a in extra):  # not the machine's /var/run/cdi
            extra = (*extra, f"--cdi-dir={self.health_file.parent / 'cdi'}")
        self.comp = self.cluster._run(
            self.name,
            [
                sys.executable,
                "-m",
                "gpushare_hub.plugin.app",
                "--backend=simulated",
                "--simulate=2x Tesla T4:15360",
                f"--node-name={self.node}",
                f"--kubeconfig={self.kubeconfig}",
                f"--plugin-dir={self.plugin_dir}",
                f"--health-file={self.health_file}",
                f"--hook-host-path={self.hook_dir}",
                *extra,
            ],
        )

    def kill(self) -> None:
        assert self.comp is not None
        self.comp.kill()
