"""The kubelet's ``v1beta1.DevicePlugin`` service: gRPC calls to :class:`.state.PluginState` and back."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any, NoReturn

import grpc

from gpushare_hub.core.errors import GPUShareError

from .api import deviceplugin_v1beta1_pb2 as pb
from .api import deviceplugin_v1beta1_pb2_grpc as pbg
from .matching import MEMORY
from .requests import BadRequest, read_allocate, read_preferred
from .response import ContainerResponse
from .state import PluginState

log = logging.getLogger("gpushare.plugin")


def allocate_response(r: ContainerResponse) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=r.envs,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in r.mounts
        ],
        cdi_devices=[pb.CDIDevice(name=name) for name in r.cdi_devices],
    )


class Servicer(pbg.DevicePluginServicer):
    """Translates gRPC calls to :class:`PluginState` and back; nothing else."""

    def __init__(self, state: PluginState, stop: threading.Event, resource: str = MEMORY) -> None:
        self.state = state
        self.stop = stop
        self.resource = resource

    def _devices(self) -> list[pb.Device]:
        return self.state.devices() if self.resource == MEMORY else self.state.count_devices()

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        st = self.state
        seen = -1
        while not self.stop.is_set() and context.is_active():
            with st.changed:
                if seen == st.generation:
                    st.changed.wait(timeout=1.0)
                if seen == st.generation:
                    continue
                seen = st.generation
            yield pb.ListAndWatchResponse(devices=self._devices())

    def _refuse(self, context: Any, call: str, err: BadRequest) -> NoReturn:
        log.warning("%s refused: %s", call, err)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{call}: {err}")
        raise AssertionError("grpc's abort always raises")

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        known = self.state.served_ids(self.resource)
        try:
            asks = read_preferred(
                [
                    (r.available_deviceIDs, r.must_include_deviceIDs, r.allocation_size)
                    for r in request.container_requests
                ],
                known,
            )
        except BadRequest as err:
            self._refuse(context, "GetPreferredAllocation", err)
        pick = self.state.preferred if self.resource == MEMORY else self.state.preferred_count
        out = [
            pb.ContainerPreferredAllocationResponse(
                deviceIDs=pick(list(a.available), list(a.must_include), a.size)
            )
            for a in asks
        ]
        return pb.PreferredAllocationResponse(container_responses=out)

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        try:
            containers = read_allocate(
                [r.devices_ids for r in request.container_requests], self.state.served_ids(self.resource)
            )
        except BadRequest as err:
            self._refuse(context, "Allocate", err)
        responses = []
        for ids in containers:
            try:
                r = self.state.allocate(list(ids), self.resource)
            except GPUShareError as err:
                log.error("Allocate of %d device(s) failed: %s", len(ids), err)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            responses.append(allocate_response(r))
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()
