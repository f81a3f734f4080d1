"""The DRA kubelet plugin behind its real gRPC sockets, and the claims a fake API server holds for
it, for tests of Prepare and Unprepare (tests/unit/test_dra_driver.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc

from gpushare_hub.core.cards import Card
from gpushare_hub.core.draslice import parse_sizes
from gpushare_hub.core.names import DRA_DRIVER
from gpushare_hub.plugin.api import dra_v1_pb2 as dra
from gpushare_hub.plugin.api import dra_v1_pb2_grpc as dra_grpc
from gpushare_hub.plugin.api import pluginregistration_v1_pb2_grpc as reg_grpc
from gpushare_hub.plugin.dra.driver import Driver, DriverConfig
from gpushare_hub.plugin.dra.prepared import PreparedClaims
from gpushare_hub.plugin.dra.servicer import Sockets
from gpushare_hub.plugin.response import Isolation

GI = 1 << 30
NODE = "gpu-1"
T4 = [Card(0, "GPU-aaaa", "Tesla T4", 15, 15360), Card(1, "GPU-bbbb", "Tesla T4", 15, 15360)]
SIZES = parse_sizes("3Gi,5Gi,7Gi")


def claim(name: str, uid: str, *results: dict[str, Any], allocated: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {
        "reservedFor": [{"resource": "pods", "name": f"jupyter-{name}", "uid": "p-" + uid}]
    }
    if allocated:
        status["allocation"] = {"devices": {"results": list(results)}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": "jhub", "name": name, "uid": uid},
        "status": status,
    }


def result(device: str = "gpu-0", memory: Any = "5Gi", pool: str = NODE, driver: str = DRA_DRIVER) -> dict:
    return {
        "request": "gpu",
        "driver": driver,
        "pool": pool,
        "device": device,
        "consumedCapacity": {"memory": memory},
    }


class Claims:
    def __init__(self, *objs: dict[str, Any]) -> None:
        self.objs = {o["metadata"]["name"]: o for o in objs}
        self.asked: list[str] = []

    def claim(self, namespace: str, name: str) -> Any:
        self.asked.append(name)
        if name not in self.objs:
            raise LookupError("no such ResourceClaim on the API server")
        return self.objs[name]


class Plugin:
    """A driver behind its real sockets, and a kubelet-side client of each."""

    def __init__(self, tmp: Path, source: Claims, cdi: bool = True) -> None:
        self.tmp, self.source = tmp, source
        self.changes = 0
        self.registered = 0
        iso = Isolation(hook_host_path="/var/lib/gpushare-hub/pyhook", cdi=cdi)
        config = DriverConfig(NODE, GI, 1024, SIZES, str(tmp / "cdi"))
        self.driver = Driver(
            config, lambda: T4, lambda: iso, source, PreparedClaims(tmp / "plugin"), self._changed
        )
        self.sockets = Sockets(str(tmp / "plugin"), str(tmp / "registry"), self.driver, self._registered)
        self.sockets.start()
        self.channels = [
            grpc.insecure_channel(f"unix://{p}") for p in (self.sockets.dra_path, self.sockets.reg_path)
        ]
        self.dra = dra_grpc.DRAPluginStub(self.channels[0])
        self.reg = reg_grpc.RegistrationStub(self.channels[1])

    def _changed(self) -> None:
        self.changes += 1

    def _registered(self) -> None:
        self.registered += 1

    def prepare(self, *names_uids: tuple[str, str]) -> Any:
        req = dra.NodePrepareResourcesRequest(
            claims=[dra.Claim(namespace="jhub", name=n, uid=u) for n, u in names_uids]
        )
        return self.dra.NodePrepareResources(req, timeout=10)

    def unprepare(self, *names_uids: tuple[str, str]) -> Any:
        req = dra.NodeUnprepareResourcesRequest(
            claims=[dra.Claim(namespace="jhub", name=n, uid=u) for n, u in names_uids]
        )
        return self.dra.NodeUnprepareResources(req, timeout=10)

    def spec(self, uid: str) -> dict[str, Any]:
        return json.loads((self.tmp / "cdi" / f"gpushare-hub.io-claim_{uid}.json").read_text())

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.sockets.stop(0)
