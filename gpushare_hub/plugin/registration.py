"""Serving the plugin's sockets and registering them with the kubelet, again after a kubelet restart.

Flow (kubelet device plugin API v1beta1): serve ``DevicePlugin`` on a unix socket
in the kubelet's device-plugins folder, call ``Registration/Register`` on
``kubelet.sock``, then the kubelet dials back, keeps ``ListAndWatch`` open, and at
pod admission calls ``GetPreferredAllocation`` and ``Allocate`` per container.
A kubelet restart wipes the folder; when our socket disappears we serve and
register again.

Two resources are registered, each on its own socket and served by the same state:
``aliyun.com/gpu-mem`` (one device per unit of a card) and ``aliyun.com/gpu-count`` (one
device per card, its ID the card UUID). The kubelet calls a plugin's Allocate only for a
resource that plugin registered, so without the second a pod asking whole cards by
gpu-count alone would start with no card named at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

from .api import deviceplugin_v1beta1_pb2 as pb
from .api import deviceplugin_v1beta1_pb2_grpc as pbg
from .health import watch_health
from .matching import COUNT, MEMORY
from .servicer import Servicer
from .state import PluginState

log = logging.getLogger("gpushare.plugin")

VERSION = "v1beta1"


class Runner:
    """Serves the socket, registers with the kubelet, and starts over when the kubelet restarts."""

    def __init__(
        self,
        state: PluginState,
        on_registered: Callable[[], None] | None = None,
        on_health: Callable[[], None] | None = None,
    ) -> None:
        """``on_health``: called after a card's health changed (publishes the inventory, so
        that the extender stops choosing an unhealthy card at once)."""
        self.state = state
        self.settings = state.settings
        self.stop = threading.Event()
        self.servers: list[grpc.Server] = []
        self.on_registered = on_registered
        self.on_health = on_health

    @property
    def socket(self) -> Path:
        return Path(self.settings.plugin_dir) / self.settings.socket_name

    @property
    def count_socket(self) -> Path:
        return Path(self.settings.plugin_dir) / self.settings.count_socket_name

    def _endpoints(self) -> list[tuple[str, str, Path]]:
        """(resource kind, resource name, socket) of each resource this plugin serves."""
        names = self.settings.names
        return [(MEMORY, names.memory, self.socket), (COUNT, names.count, self.count_socket)]

    @property
    def kubelet_socket(self) -> Path:
        return Path(self.settings.plugin_dir) / "kubelet.sock"

    def serve(self) -> None:
        for kind, _, sock in self._endpoints():
            if sock.exists():
                sock.unlink()
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
            pbg.add_DevicePluginServicer_to_server(Servicer(self.state, self.stop, kind), server)
            server.add_insecure_port(f"unix://{sock}")
            server.start()
            self.servers.append(server)

    def register(self, timeout: float = 10.0) -> None:
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as ch:
            grpc.channel_ready_future(ch).result(timeout=timeout)
            for _, resource, sock in self._endpoints():
                pbg.RegistrationStub(ch).Register(
                    pb.RegisterRequest(
                        version=VERSION,
                        endpoint=sock.name,
                        resource_name=resource,
                        options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                    ),
                    timeout=timeout,
                )
        log.info(
            "registered %s and %s with the kubelet (%s), %d cards, %d devices",
            self.settings.names.memory,
            self.settings.names.count,
            self.kubelet_socket,
            len(self.state.cards),
            len(self.state.devices()),
        )
        if self.on_registered:
            self.on_registered()

    def start_once(self) -> None:
        self.serve()
        try:
            self.register()
        except Exception:
            self.shutdown_server()
            raise

    def shutdown_server(self) -> None:
        for server in self.servers:
            server.stop(grace=0.5).wait()
        self.servers = []

    def _sockets_present(self) -> bool:
        return self.socket.exists() and self.count_socket.exists()

    def run(self, poll: float = 0.5) -> None:
        """Until stopped: keep serving and registered; re-register whenever our socket vanishes."""
        health = threading.Thread(
            target=watch_health, args=(self.state, self.stop, self.on_health), daemon=True
        )
        health.start()
        while not self.stop.is_set():
            try:
                self.start_once()
            except Exception as err:
                log.warning("cannot register with the kubelet at %s (%s); retrying", self.kubelet_socket, err)
                self.stop.wait(2.0)
                continue
            while not self.stop.is_set() and self._sockets_present():
                self.stop.wait(poll)
            if not self.stop.is_set():
                log.warning(
                    "our socket %s vanished (the kubelet restarted): serving and registering again",
                    self.socket,
                )
                self.shutdown_server()
        self.shutdown_server()
        # Our sockets go with us: a stopped plugin leaves nothing in the kubelet's folder.
        for sock in (self.socket, self.count_socket):
            sock.unlink(missing_ok=True)

    def shutdown(self) -> None:
        self.stop.set()
        with self.state.changed:
            self.state.changed.notify_all()
