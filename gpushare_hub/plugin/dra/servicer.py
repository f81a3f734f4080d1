"""The kubelet's two gRPC services, as the DRA plugin serves them on unix sockets.

* ``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`` on ``<plugin dir>/dra.sock``: NodePrepareResources
  and NodeUnprepareResources, answered by :class:`~.driver.Driver` (every claim in the request
  appears in the answer, with its devices or its error);
* ``pluginregistration.Registration`` on ``<registry dir>/<driver>-reg.sock``: GetInfo tells the
  kubelet's plugin watcher our name, the DRA socket and the API versions we serve, and
  NotifyRegistrationStatus says whether the kubelet took us. A kubelet that restarted registers us
  again (and has deleted the node's ResourceSlices): the slice is published again then.

The DRA socket is served before the registration socket exists, so that the kubelet, which calls
as soon as it sees the latter, finds the former; both are removed when the plugin stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from gpushare_hub.core.names import DRA_DRIVER

from ..api import dra_v1_pb2 as dra
from ..api import dra_v1_pb2_grpc as dra_grpc
from ..api import pluginregistration_v1_pb2 as reg
from ..api import pluginregistration_v1_pb2_grpc as reg_grpc
from .driver import ClaimRef, Driver

log = logging.getLogger("gpushare.dra")

DRA_SOCKET = "dra.sock"
REGISTRATION_SOCKET = f"{DRA_DRIVER}-reg.sock"
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)  # the kubelet's own words for the DRA v1 service
MAX_CLAIMS = 256  # claims read from one request; more are answered with an error each


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


class DRAServicer(dra_grpc.DRAPluginServicer):
    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        refs = _refs(request.claims)
        answers = self.driver.prepare(refs[:MAX_CLAIMS])
        resp = dra.NodePrepareResourcesResponse()
        for ref in refs:
            got = answers.get(ref.uid)
            entry = resp.claims[ref.uid]
            if got is None:
                entry.error = f"claim {ref.namespace}/{ref.name}: more than {MAX_CLAIMS} claims in one call"
                continue
            entry.error = got.error
            for d in got.devices:
                dev = entry.devices.add(
                    request_names=list(d.requests),
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_ids),
                )
                if d.share_id:
                    dev.share_id = d.share_id
        return resp

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        refs = _refs(request.claims)
        errors = self.driver.unprepare(refs[:MAX_CLAIMS])
        resp = dra.NodeUnprepareResourcesResponse()
        for ref in refs:
            resp.claims[ref.uid].error = errors.get(ref.uid, f"more than {MAX_CLAIMS} claims in one call")
        return resp


class RegistrationServicer(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: str, on_registered: Callable[[], None]) -> None:
        self.endpoint = endpoint
        self.on_registered = on_registered
        self.registered = False

    def GetInfo(self, request: Any, context: Any) -> Any:
        return reg.PluginInfo(
            type="DRAPlugin",
            name=DRA_DRIVER,
            endpoint=self.endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.registered = bool(request.plugin_registered)
        if request.plugin_registered:
            log.info("registered with the kubelet as DRA driver %s", DRA_DRIVER)
            try:
                self.on_registered()
            except Exception as err:  # the kubelet must get its answer
                log.warning("could not publish after registration: %s", err)
        else:
            log.error("the kubelet refused the registration: %s", request.error)
        return reg.RegistrationStatusResponse()


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class Sockets:
    """The two servers; :meth:`start` serves DRA first, then registration; :meth:`stop` removes both."""

    def __init__(self, plugin_dir: str, registry_dir: str, driver: Driver, on_registered: Callable[[], None]):
        self.dra_path = Path(plugin_dir) / DRA_SOCKET
        self.reg_path = Path(registry_dir) / REGISTRATION_SOCKET
        self.registration = RegistrationServicer(str(self.dra_path), on_registered)
        self._dra = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dra_grpc.add_DRAPluginServicer_to_server(DRAServicer(driver), self._dra)  # type: ignore[no-untyped-call]
        self._reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        reg_grpc.add_RegistrationServicer_to_server(self.registration, self._reg)  # type: ignore[no-untyped-call]

    def start(self) -> None:
        for server, path in ((self._dra, self.dra_path), (self._reg, self.reg_path)):
            path.parent.mkdir(parents=True, exist_ok=True)
            _unlink(path)  # a socket left by a plugin that was killed
            if not server.add_insecure_port(f"unix://{path}"):
                raise OSError(f"cannot listen on {path}")
            server.start()
        log.info("serving DRA on %s, registration on %s", self.dra_path, self.reg_path)

    def stop(self, grace: float = 2.0) -> None:
        self._reg.stop(grace).wait()
        _unlink(self.reg_path)
        self._dra.stop(grace).wait()
        _unlink(self.dra_path)
