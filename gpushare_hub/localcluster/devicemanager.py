"""The kubelet's side of the device plugin API for one local notebook node, without root.

A kubelet serves ``Registration`` on ``kubelet.sock`` in its device-plugins folder; a plugin
registers there, the kubelet dials the plugin's socket back, keeps ``ListAndWatch`` open and,
when a container that asks the resource starts, calls ``GetPreferredAllocation`` (when the
plugin offers it) and ``Allocate`` with device IDs that no other container holds.
:class:`DeviceManager` does the same in a folder of its own (one per simulated node), over
the plugin's real gRPC socket, with the generated stubs in ``gpushare_hub/plugin/api``. Which device IDs
each container holds is the caller's to remember (the agent keeps it with the pod's state,
as the kubelet keeps its checkpoint file) and to hand back through :meth:`hold`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpushare_hub.plugin.api import deviceplugin_v1beta1_pb2 as pb
from gpushare_hub.plugin.api import deviceplugin_v1beta1_pb2_grpc as pbg

from .podprocess import Mount

log = logging.getLogger("gpushare.nodeagent")

KUBELET_SOCKET = "kubelet.sock"


class DeviceUnavailable(RuntimeError):
    """No plugin registered yet, too few free devices, or the plugin refused; retry later."""


@dataclass(frozen=True)
class Allocation:
    device_ids: tuple[str, ...]
    envs: dict[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()


class _Registration(pbg.RegistrationServicer):
    def __init__(self, manager: DeviceManager) -> None:
        self.manager = manager

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version}")
        self.manager._on_register(request)
        return pb.Empty()


class DeviceManager:
    """Registration server and plugin client for one node's device-plugins folder."""

    def __init__(
        self,
        node: str,
        folder: Path,
        resource: str = "aliyun.com/gpu-mem",
        on_devices: Callable[[str, int, int], None] | None = None,
    ) -> None:
        """``resource``: the one resource served here (the notebooks ask GPU memory); a plugin's
        registrations of other resources (gpushare's aliyun.com/gpu-count) are acknowledged
        and left unused. ``on_devices(resource, devices, healthy)``: called when ListAndWatch
        changes the count, as a kubelet then writes the Node's capacity and allocatable (an
        overcommitted node's plugin offers more devices than its cards' units)."""
        self.on_devices = on_devices
        self.node = node
        self.folder = folder
        self.resource = resource
        self.devices: dict[str, str] = {}  # device ID -> health
        self.held: dict[str, str] = {}  # device ID -> holder ("pod-uid/container")
        self._preferred = False
        self._channel: grpc.Channel | None = None
        self._stub: pbg.DevicePluginStub | None = None
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self.registered = threading.Event()

    @property
    def socket(self) -> Path:
        return self.folder / KUBELET_SOCKET

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.socket.exists():
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pbg.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    # ---- plugin side ---------------------------------------------------------------------
    def _on_register(self, request: pb.RegisterRequest) -> None:
        endpoint = self.folder / request.endpoint
        if request.resource_name != self.resource:
            log.info("node %s: registration of %s not used here", self.node, request.resource_name)
            return
        log.info("node %s: plugin for %s registered at %s", self.node, request.resource_name, endpoint)
        channel = grpc.insecure_channel(f"unix://{endpoint}")
        with self._lock:
            if self._channel is not None:
                self._channel.close()
            self._channel = channel
            self._stub = pbg.DevicePluginStub(channel)
            self.resource = request.resource_name
            self._preferred = request.options.get_preferred_allocation_available
        threading.Thread(target=self._list_and_watch, args=(channel,), daemon=True).start()

    def _counts(self) -> tuple[int, int]:
        return len(self.devices), sum(1 for h in self.devices.values() if h == "Healthy")

    def _list_and_watch(self, channel: grpc.Channel) -> None:
        stub = pbg.DevicePluginStub(channel)
        try:
            for resp in stub.ListAndWatch(pb.Empty()):
                with self._lock:
                    before = self._counts()
                    self.devices = {d.ID: d.health for d in resp.devices}
                    after = self._counts()
                if self.on_devices is not None and after != before:
                    self.on_devices(self.resource, *after)
                self.registered.set()
        except grpc.RpcError as err:
            if self._channel is channel:
                log.warning(
                    "node %s: ListAndWatch ended (%s); waiting for the plugin to register again",
                    self.node,
                    err.code(),
                )
                self.registered.clear()

    # ---- allocation ------------------------------------------------------------------------
    def hold(self, holder: str, ids: Iterable[str]) -> None:
        """Mark devices as held (an adopted container's, from the agent's state)."""
        with self._lock:
            for i in ids:
                self.held[i] = holder

    def release(self, holder: str) -> None:
        with self._lock:
            self.held = {i: h for i, h in self.held.items() if h != holder}

    def allocate(self, holder: str, count: int, timeout: float = 10.0) -> Allocation:
        """GetPreferredAllocation then Allocate for ``count`` free healthy devices, as a kubelet."""
        with self._lock:
            stub = self._stub
            free = sorted(i for i, h in self.devices.items() if h == "Healthy" and i not in self.held)
        if stub is None or not self.registered.is_set():
            raise DeviceUnavailable(f"node {self.node}: no device plugin has registered at {self.socket}")
        if len(free) < count:
            raise DeviceUnavailable(
                f"node {self.node}: {count} devices of {self.resource} asked, {len(free)} free"
            )
        ids = free[:count]
        try:
            if self._preferred:
                pref = stub.GetPreferredAllocation(
                    pb.PreferredAllocationRequest(
                        container_requests=[
                            pb.ContainerPreferredAllocationRequest(
                                available_deviceIDs=free, allocation_size=count
                            )
                        ]
                    ),
                    timeout=timeout,
                )
                chosen = list(pref.container_responses[0].deviceIDs)
                if len(chosen) == count and set(chosen) <= set(free):
                    ids = chosen
            resp = stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]),
                timeout=timeout,
            )
        except grpc.RpcError as err:
            raise DeviceUnavailable(f"node {self.node}: the plugin refused: {err.details()}") from err
        answer = resp.container_responses[0]
        self.hold(holder, ids)
        return Allocation(
            device_ids=tuple(ids),
            envs=dict(answer.envs),
            mounts=tuple(Mount(m.host_path, m.container_path) for m in answer.mounts),
        )
