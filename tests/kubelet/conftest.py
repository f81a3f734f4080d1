"""Kubelet tier: our device plugin against the kubelet's own device manager (dmharness).

The device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager, built from the
pinned module) serves /var/lib/kubelet/device-plugins/kubelet.sock, as the kubelet does;
our plugin registers there, and pods come from the real API server, scheduled by the real
kube-scheduler and our extender.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare_hub.localcluster import build
from gpushare_hub.localcluster.cluster import LocalCluster
from tests.conftest import wait_for
from tests.jsonlines import JsonLineShim
from tests.support.plugin_node import NODE, PLUGIN_DIR, Plugin


class DeviceManager(JsonLineShim):
    """The dmharness process: one JSON command in, one JSON answer out."""

    def __init__(self, binary: Path, log: Path) -> None:
        super().__init__([str(binary)], log)

    def units(self, resource: str = "aliyun.com/gpu-mem") -> tuple[int, int]:
        cap = self.call("capacity")
        return int((cap.get("capacity") or {}).get(resource, "0")), int(
            (cap.get("allocatable") or {}).get(resource, "0")
        )


# The tier's fixtures live as long as the tier (package scope), not the session: the kubelet's
# socket folder is the machine's, and `make test` runs this tier at two Kubernetes versions in two
# sessions side by side, which take turns on it (PLUGIN_DIR_LOCK).
PLUGIN_DIR_LOCK = PLUGIN_DIR / ".gpushare-kubelet-tier.lock"


@pytest.fixture(scope="package")
def device_manager(local_cluster: LocalCluster) -> Iterator[DeviceManager]:
    if os.geteuid() != 0:
        pytest.fail(
            "the kubelet tier needs root: the kubelet's socket path /var/lib/kubelet/device-plugins "
            "is hard-coded in its device manager",
            pytrace=False,
        )
    binary = build.build_go_shim(Path(__file__).parent / "dmharness" / "main.go", "dmharness")
    PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
    with PLUGIN_DIR_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session's kubelet tier finishes first
        dm = DeviceManager(binary, local_cluster.logs / "dmharness.log")
        yield dm
        dm.close()


def extender_knows_the_plugins_cards(url: str) -> bool:
    from tests.support.extender import inspect

    try:
        cards = inspect(url, NODE)["nodes"][0]["cards"]
    except (OSError, LookupError):
        return False
    return bool(cards) and all(c["uuid"].startswith("GPU-") for c in cards)


@pytest.fixture(scope="package")
def plugin(
    local_cluster: LocalCluster,
    device_manager: DeviceManager,
    gpushare: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Plugin]:
    """Our plugin on node dp-node (2 simulated T4), registered with the device manager."""
    node = local_cluster.node_object(NODE, [], labels={"test-group": NODE})
    node["metadata"]["annotations"].pop("gpushare-hub.io/cards")  # the plugin publishes the inventory
    for key in ("capacity", "allocatable"):
        node["status"][key].update({"aliyun.com/gpu-mem": "30", "aliyun.com/gpu-count": "2"})
    local_cluster.core_api().create_node(node)
    local_cluster.wait_nodes_ready([NODE])
    p = Plugin(local_cluster, tmp_path_factory.mktemp("health") / "health.json")
    p.start()
    assert wait_for(lambda: device_manager.units() == (30, 30), timeout=30), device_manager.call("capacity")
    # The extender has read the inventory the plugin published (else it places on the cards it
    # made up from the Node's capacity, which the plugin does not know).
    assert wait_for(lambda: extender_knows_the_plugins_cards(gpushare.url), timeout=30)
    yield p
    if p.comp is not None:
        p.comp.stop()
