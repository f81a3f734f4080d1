"""The device plugin's gRPC doors, driven with the kubelet's own DevicePlugin client (dpclient, built
from the pinned k8s.io/kubelet API): Allocate and GetPreferredAllocation on both of the plugin's
sockets (gpu-mem units and whole cards), with device IDs the plugin serves mixed with any text,
repeated IDs, empty and overlong lists, and any int32 size. Never ``Unknown`` or ``Internal`` (the
gRPC 5xx), never a traceback in the plugin's log, the plugin still answering, and nothing claimed:
its device list, its served-containers file and its Node unchanged."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpushare_hub.localcluster import build
from gpushare_hub.localcluster.cluster import LocalCluster
from tests.conftest import wait_for
from tests.jsonlines import JsonLineShim
from tests.support.fuzzing import any_text, seeded_cases
from tests.support.plugin_node import Plugin

from .conftest import CASES, SEED, LogWatch, report

pytestmark = pytest.mark.fuzz
NODE = "fuzz-dp-node"
SERVER_ERRORS = {"Unknown", "Internal", "DataLoss", "Unimplemented"}


class KubeletClient(JsonLineShim):
    """The dpclient process: the kubelet's Registration server and DevicePlugin client."""

    def __init__(self, binary: Path, folder: Path, log: Path) -> None:
        super().__init__([str(binary), str(folder)], log)

    def call(self, op: str, timeout: float = 60, **kw: Any) -> dict[str, Any]:
        answer = super().call(op, timeout, **kw)
        assert "error" not in answer, answer  # the shim's own trouble, not the plugin's answer
        return answer


@pytest.fixture(scope="module")
def plugin_door(local_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The plugin on a node of its own (tainted, so that nothing else is placed there), registered
    with dpclient; removed afterwards."""
    binary = build.build_go_shim(Path(__file__).parent / "dpclient" / "main.go", "dpclient")
    folder = tmp_path_factory.mktemp("plugin-door")
    node = local_cluster.node_object(NODE, [], labels={"test-group": NODE})
    node["metadata"]["annotations"].pop("gpushare-hub.io/cards")  # the plugin publishes the inventory
    node.setdefault("spec", {})["taints"] = [{"key": "fuzz", "value": "plugin", "effect": "NoSchedule"}]
    api = local_cluster.core_api()
    api.create_node(node)
    client = KubeletClient(binary, folder, local_cluster.logs / "dpclient.log")
    plugin = Plugin(local_cluster, folder / "health.json", NODE, folder, "gpushare-device-plugin-fuzz")
    plugin.start(f"--served-file={folder / 'served.json'}")
    assert plugin.comp is not None
    try:
        assert wait_for(lambda: len(client.call("registered")["registered"]) == 2, timeout=60), (
            plugin.comp.log
        )
        published = ("gpushare-hub.io/cards", "gpushare-hub.io/isolation", "gpushare-hub.io/usage")
        assert wait_for(
            lambda: set(published) <= set(api.read_node(NODE).metadata.annotations or {}), timeout=60
        ), plugin.comp.log
        yield client, plugin
    finally:
        client.close()
        plugin.comp.stop()
        api.delete_node(NODE)


def served_file(plugin: Plugin) -> Path:
    return plugin.plugin_dir / "served.json"


def _snapshot(client: KubeletClient, plugin: Plugin, cluster: LocalCluster) -> Any:
    devices = {
        r["endpoint"]: client.call("devices", endpoint=r["endpoint"])["response"]
        for r in client.call("registered")["registered"]
    }
    node = cluster.get_json(f"/api/v1/nodes/{NODE}")
    served = served_file(plugin).read_text() if served_file(plugin).exists() else ""
    return devices, node["metadata"].get("annotations"), served


@pytest.mark.parametrize("op", ["allocate", "preferred"])
def test_the_plugins_grpc_doors_refuse_malformed_requests_with_invalid_argument(
    plugin_door: Any, local_cluster: LocalCluster, op: str
) -> None:
    """One door per method (Allocate, GetPreferredAllocation), each on both sockets. The cases come
    from a seeded ``random.Random`` (drawing them with Hypothesis took longer than sending them)."""
    client, plugin = plugin_door
    registered = {r["resource"]: r["endpoint"] for r in client.call("registered")["registered"]}
    before = _snapshot(client, plugin, local_cluster)
    known = {
        endpoint: sorted(d["ID"] for d in before[0][endpoint]["devices"]) for endpoint in registered.values()
    }
    assert plugin.comp is not None
    watch = LogWatch(plugin.comp.log)
    codes: Counter[tuple[str, str]] = Counter()
    specials = ["", "\x00", "x" * 5000, "GPU-0-_-99", "GPU-0-_--1"]

    def junk(rng: random.Random) -> str:
        return any_text(rng, 80) if rng.random() < 0.7 else rng.choice(specials)

    def ids(rng: random.Random, endpoint: str) -> list[str]:
        served = known[endpoint]
        shape = rng.randrange(3)
        if shape == 0:  # served IDs mixed with any text
            n = rng.randint(0, 12)
            return [rng.choice(served) if rng.random() < 0.5 else junk(rng) for _ in range(n)]
        if shape == 1:  # distinct served IDs
            return rng.sample(served, rng.randint(1, min(31, len(served))))
        return [rng.choice(served) for _ in range(rng.randint(0, 40))]  # repeats

    def call(rng: random.Random) -> tuple[str, str, Any]:
        endpoint = rng.choice(sorted(known))
        n = rng.choice([0, 1, 2, 3, 300])
        copies = 100 if n == 300 else 1
        if op == "allocate":
            return op, endpoint, [ids(rng, endpoint) for _ in range(min(n, 3))] * copies
        size = rng.randint(-(2**31), 2**31 - 1) if rng.random() < 0.5 else rng.randint(0, 20)
        ask = lambda: {"available": ids(rng, endpoint), "must": ids(rng, endpoint), "size": size}  # noqa: E731
        asks = [ask() for _ in range(min(n, 3))]
        return op, endpoint, asks * copies

    for endpoint, containers in ((c[1], c[2]) for c in seeded_cases(call, CASES, SEED)):
        answer = client.call(op, endpoint=endpoint, containers=containers)
        codes[(op, answer["code"])] += 1
        assert answer["code"] not in SERVER_ERRORS, (endpoint, str(containers)[:300], answer)
        if answer["code"] != "OK":
            assert answer["message"], answer
        if answer["code"] == "InvalidArgument":
            assert "container_requests" in answer["message"] and len(answer["message"]) < 400, answer
    tracebacks, first = watch.first_traceback()
    shown = ", ".join(f"{op} {code}: {n}" for (op, code), n in sorted(codes.items()))
    method = {"allocate": "Allocate", "preferred": "GetPreferredAllocation"}[op]
    report(f"fuzz device plugin {method}: {sum(codes.values())} cases, 0 x Unknown/Internal, "
          f"{tracebacks} tracebacks ({shown})")  # fmt: skip
    assert tracebacks == 0, first
    assert plugin.comp.alive(), "the plugin died"
    assert _snapshot(client, plugin, local_cluster) == before, "a refused request changed the plugin's state"
    assert codes[(op, "InvalidArgument")] and codes[(op, "OK")] + codes[(op, "FailedPrecondition")], codes
