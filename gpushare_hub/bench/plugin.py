"""``gpushare-bench plugin``: Allocate latency and the size of the ListAndWatch message.

* ``list_and_watch_bytes``: the ListAndWatch message of a node with 8 cards x 80 GiB
  in GiB units (640 devices), against the kubelet's 4 MB gRPC limit; the same node
  in MiB units is reported beside it (``list_and_watch_bytes_mib_unit``), which is
  how Aliyun's plugin overflowed.
* ``allocate_*``: Allocate calls through the plugin's real gRPC server on a unix
  socket, one per pending pod, with pods read from memory instead of the API
  server (``allocate_excludes_api_server``; in a cluster one pod list is added).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .args import at_least_one

KUBELET_GRPC_LIMIT = 4 * 1024 * 1024


def _state(spec: str, unit: str, pods: Any) -> Any:
    from gpushare_hub.core.resources import ResourceNames
    from gpushare_hub.plugin.backends import SimulatedBackend
    from gpushare_hub.plugin.settings import Settings
    from gpushare_hub.plugin.state import PluginState

    return PluginState(
        SimulatedBackend(spec, "bench-node"),
        pods,
        Settings(node="bench-node", names=ResourceNames(unit=unit)),
    )


def measure(requests: int) -> dict[str, Any]:
    import grpc

    from gpushare_hub.core import AllocationRecord, CardShare, ContainerShare, PodObject, read_pod
    from gpushare_hub.plugin.api import deviceplugin_v1beta1_pb2 as pb
    from gpushare_hub.plugin.api import deviceplugin_v1beta1_pb2_grpc as pbg
    from gpushare_hub.plugin.devices import device_ids
    from gpushare_hub.plugin.servicer import Servicer
    from gpushare_hub.plugin.state import PodSource

    class Pods(PodSource):
        def __init__(self) -> None:
            self.items: list[dict[str, Any]] = []

        def pods_on_node(self, node: str) -> list[PodObject]:
            return [read_pod(p) for p in self.items]  # read as KubePods reads its list

        def mark_assigned(self, namespace: str, name: str, uid: str) -> None:
            self.items = [p for p in self.items if p["metadata"]["uid"] != uid]

    big = _state("8x H100:81920", "GiB", Pods())
    size = pb.ListAndWatchResponse(devices=big.devices()).ByteSize()
    size_mib = pb.ListAndWatchResponse(devices=_state("8x H100:81920", "MiB", Pods()).devices()).ByteSize()

    pods = Pods()
    state = _state("8x H100:81920", "GiB", pods)
    uuid = state.cards[0].uuid
    ids = device_ids(state.cards[0])
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as tmp:
        sock = Path(tmp) / "bench.sock"
        server = grpc.server(ThreadPoolExecutor(4))
        pbg.add_DevicePluginServicer_to_server(Servicer(state, stop), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        channel = grpc.insecure_channel(f"unix://{sock}")
        stub = pbg.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        lat = []
        for i in range(requests):
            rec = AllocationRecord(
                "bench-node", (CardShare(uuid, 0, 4),), (ContainerShare("notebook", uuid, 4),)
            )
            pods.items = [
                {
                    "metadata": {
                        "name": f"p{i}",
                        "namespace": "bench",
                        "uid": f"u{i}",
                        "annotations": rec.pod_annotations({uuid: 80}, i),
                    },
                    "spec": {
                        "nodeName": "bench-node",
                        "containers": [
                            {"name": "notebook", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}
                        ],
                    },
                    "status": {"phase": "Pending"},
                }
            ]
            req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids[:4])])
            t0 = time.perf_counter()
            stub.Allocate(req)
            lat.append((time.perf_counter() - t0) * 1000)
        stop.set()
        channel.close()
        server.stop(0)
    lat.sort()
    return {
        "cards": 8,
        "card_gib": 80,
        "devices": len(big.devices()),
        "list_and_watch_bytes": size,
        "list_and_watch_bytes_mib_unit": size_mib,
        "kubelet_limit_bytes": KUBELET_GRPC_LIMIT,
        "allocate_p50_ms": round(lat[len(lat) // 2], 3),
        "allocate_p99_ms": round(lat[int(0.99 * len(lat))], 3),
        "allocate_excludes_api_server": True,
        "requests": requests,
    }


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plugin", help="device plugin Allocate latency and ListAndWatch size")
    p.add_argument("--requests", type=at_least_one, default=500)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = measure(args.requests)
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"ListAndWatch, 8 x 80 GiB in GiB units: {out['list_and_watch_bytes']} bytes "
            f"({out['devices']} devices; MiB units would be {out['list_and_watch_bytes_mib_unit']} bytes; "
            f"the kubelet's limit is {KUBELET_GRPC_LIMIT})"
        )
        print(f"Allocate p50 {out['allocate_p50_ms']} ms, p99 {out['allocate_p99_ms']} ms (pods from memory)")
    return 0
