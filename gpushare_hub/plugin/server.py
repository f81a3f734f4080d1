"""The device plugin: state and allocation logic, the thin gRPC servicer, and the kubelet loop.

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

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gpushare_hub.core.cards import Card, Node
from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.records import Ignored, IgnoredRecord
from gpushare_hub.core.resources import DEFAULT_NAMES, ResourceNames

from .api import deviceplugin_v1beta1_pb2 as pb
from .api import deviceplugin_v1beta1_pb2_grpc as pbg
from .backends import Backend
from .devices import card_of, device_ids, preferred, units_of
from .matching import COUNT, MEMORY, NoMatch, Waiting, match, waiting_containers
from .response import ContainerResponse, Isolation, container_response, whole_card_response

log = logging.getLogger("gpushare.plugin")

VERSION = "v1beta1"
DEFAULT_DIR = "/var/lib/kubelet/device-plugins"


class PodSource:
    """How the plugin reads the pods of its node and marks them served (the API server)."""

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def mark_assigned(self, namespace: str, name: str, uid: str) -> None:
        raise NotImplementedError


@dataclass
class Settings:
    node: str
    names: ResourceNames = DEFAULT_NAMES
    reserve_fraction: float = 0.0
    plugin_dir: str = DEFAULT_DIR
    socket_name: str = "gpushare-hub.sock"
    count_socket_name: str = "gpushare-hub-count.sock"  # the aliyun.com/gpu-count endpoint
    # Containers served but whose pod is not marked assigned yet, kept across plugin restarts.
    served_file: str = ""
    isolation: Isolation = field(default_factory=Isolation)


class PluginState:
    """Cards, their health, and the allocation logic; knows nothing of gRPC."""

    def __init__(self, backend: Backend, pods: PodSource, settings: Settings) -> None:
        self.backend = backend
        self.pods = pods
        self.settings = settings
        names = settings.names
        found = backend.discover()
        self.cards = [
            Card(
                index=d.index,
                uuid=d.uuid,
                model=d.model,
                mib=d.mib,
                units=units_of(d.mib, names.mib_per_unit, settings.reserve_fraction),
            )
            for d in found
        ]
        self.health = {c.uuid: True for c in self.cards}
        self.changed = threading.Condition()
        self.generation = 0
        self._served: set[tuple[str, str]] = set()
        self._unmarked: dict[str, str] = {}  # pod UID -> key: every container served, mark not yet written
        self._lock = threading.Lock()
        self._warned: set[tuple[str, Ignored]] = set()  # ignored records already logged
        self._load_served()

    # ---- what has been served, on disk until the API server has it ---------------------------
    def _load_served(self) -> None:
        path = self.settings.served_file
        if not path or not os.path.exists(path):
            return
        try:
            with open(path) as fh:
                data = json.load(fh)
            self._served = {(str(u), str(c)) for u, c in data.get("served", [])}
            self._unmarked = {str(k): str(v) for k, v in data.get("unmarked", {}).items()}
        except (OSError, ValueError, TypeError, AttributeError) as err:
            log.error(
                "cannot read %s (%s): containers served before this restart may be matched again; "
                "delete the file if it is damaged",
                path,
                err,
            )
            return
        log.info("%d served container(s) not yet marked on their pods, from %s", len(self._served), path)

    def _save_served(self) -> None:
        """Written before Allocate answers, so that a restart cannot serve a container twice."""
        path = self.settings.served_file
        if not path:
            return
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump({"served": sorted(self._served), "unmarked": self._unmarked}, fh)
        os.replace(tmp, path)

    def _mark_served_pods(self) -> None:
        """Write ASSIGNED=true on fully served pods; then the API server remembers for us.

        A failed write keeps the pod's containers served (they must not match again)
        and is retried on the next Allocate.
        """
        for uid, key in list(self._unmarked.items()):
            namespace, name = key.split("/", 1)
            try:
                self.pods.mark_assigned(namespace, name, uid)
            except Exception as err:
                log.warning("could not mark pod %s assigned (will retry): %s", key, err)
                continue
            with self._lock:
                self._unmarked.pop(uid, None)
                self._served = {s for s in self._served if s[0] != uid}
                self._save_served()

    def card(self, uuid: str) -> Card:
        for c in self.cards:
            if c.uuid == uuid:
                return Card(c.index, c.uuid, c.model, c.units, c.mib, self.health.get(uuid, True))
        raise NoMatch(
            f"card {uuid} is not on node {self.settings.node} (the node's cards: "
            f"{', '.join(c.uuid for c in self.cards)})"
        )

    def inventory(self) -> list[Card]:
        return [self.card(c.uuid) for c in self.cards]

    def devices(self) -> list[pb.Device]:
        out: list[pb.Device] = []
        for c in self.cards:
            state = "Healthy" if self.health[c.uuid] else "Unhealthy"
            out.extend(pb.Device(ID=i, health=state) for i in device_ids(c))
        return out

    def count_devices(self) -> list[pb.Device]:
        """One device per card for the whole-card resource; its ID is the card UUID."""
        return [
            pb.Device(ID=c.uuid, health="Healthy" if self.health[c.uuid] else "Unhealthy") for c in self.cards
        ]

    def set_health(self, uuid: str, healthy: bool, reason: str) -> bool:
        """Record a card's health; True if it changed."""
        with self.changed:
            if uuid in self.health and self.health[uuid] != healthy:
                self.health[uuid] = healthy
                self.generation += 1
                log.warning("card %s is now %s (%s)", uuid, "healthy" if healthy else "UNHEALTHY", reason)
                self.changed.notify_all()
                return True
        return False

    def _waiting(self) -> list[Waiting]:
        ignored: list[IgnoredRecord] = []
        node = Node(self.settings.node, tuple(self.inventory()))
        out = waiting_containers(
            self.pods.pods_on_node(self.settings.node), node, self._served, self.settings.names, ignored
        )
        for rec in ignored:
            if (rec.uid, rec.reason) not in self._warned:
                self._warned.add((rec.uid, rec.reason))
                log.warning("%s", rec.message())
        return out

    def preferred(self, available: list[str], must: list[str], size: int) -> list[str]:
        """Keep a container's units on the card the extender chose for a container of that size.

        The extender keeps every waiting container of one size on one card, so that card
        is the answer; with none waiting (or, against that rule, several cards) the plugin
        only keeps the units together on one card.
        """
        cards = {w.cards or (w.uuid,) for w in self._waiting() if w.units == size}
        return preferred(available, must, size, cards.pop() if len(cards) == 1 else None)

    def preferred_count(self, available: list[str], must: list[str], size: int) -> list[str]:
        """The whole cards the extender chose for a container of that many cards, where they are
        available and unambiguous; else the must-includes and then the first available."""
        cards = {w.cards for w in self._waiting() if w.resource == COUNT and w.units == size}
        chosen = list(dict.fromkeys(must))[:size]
        want = [u for u in (cards.pop() if len(cards) == 1 else ()) if u in available and u not in chosen]
        rest = [u for u in available if u not in chosen and u not in want]
        return (chosen + want + rest)[:size]

    def allocate(self, ids: list[str], resource: str = MEMORY) -> ContainerResponse:
        """One container's Allocate answer for ``resource`` (MEMORY: gpu-mem units; COUNT:
        gpu-count whole cards); marks the pod assigned when all its containers are served."""
        ours = {c.uuid for c in self.cards}
        for i in ids:
            if resource == MEMORY:
                card_of(i)  # reject IDs that are not ours, with the ID named
            elif i not in ours:
                raise ValueError(f"{i!r} is not a card of node {self.settings.node}")
        with self._lock:
            waiting = self._waiting()
            w = match(ids, waiting, self.settings.node, self.settings.names.unit, resource)
            card = self.card(w.uuid)
            sick = [u for u in (w.cards or (w.uuid,)) if not self.card(u).healthy]
            if sick:
                raise NoMatch(
                    f"pod {w.pod} container {w.container}: card {', '.join(sick)} on node "
                    f"{self.settings.node} is unhealthy; it is not handed out. Delete the pod so that "
                    "it is placed on a healthy card"
                )
            self._served.add((w.uid, w.served_key))
            rest = [x for x in waiting if x.uid == w.uid and (x.uid, x.served_key) not in self._served]
            if not rest:
                self._unmarked[w.uid] = w.pod
            self._save_served()
        if resource == COUNT:
            response = whole_card_response(w, self.settings.isolation)
            log.info(
                "allocated whole card(s) %s to pod %s container %s", ",".join(w.cards), w.pod, w.container
            )
        else:
            response = container_response(w, card, self.settings.names.mib_per_unit, self.settings.isolation)
            log.info(
                "allocated %s units of card %d (%s) to pod %s container %s",
                w.units,
                card.index,
                card.uuid,
                w.pod,
                w.container,
            )
        self._mark_served_pods()
        return response


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

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        out = []
        for req in request.container_requests:
            pick = self.state.preferred if self.resource == MEMORY else self.state.preferred_count
            ids = pick(list(req.available_deviceIDs), list(req.must_include_deviceIDs), req.allocation_size)
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=out)

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        responses = []
        for req in request.container_requests:
            try:
                r = self.state.allocate(list(req.devices_ids), self.resource)
            except (GPUShareError, ValueError) as err:
                log.error("Allocate of %d device(s) failed: %s", len(req.devices_ids), err)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
            responses.append(
                pb.ContainerAllocateResponse(
                    envs=r.envs,
                    mounts=[
                        pb.Mount(
                            container_path=m.container_path, host_path=m.host_path, read_only=m.read_only
                        )
                        for m in r.mounts
                    ],
                    cdi_devices=[pb.CDIDevice(name=name) for name in r.cdi_devices],
                )
            )
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


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

    def run(self, poll: float = 0.5) -> None:
        """Until stopped: keep serving and registered; re-register whenever our socket vanishes."""
        health = threading.Thread(target=self._health_loop, daemon=True)
        health.start()
        while not self.stop.is_set():
            try:
                self.start_once()
            except Exception as err:
                log.warning("cannot register with the kubelet at %s (%s); retrying", self.kubelet_socket, err)
                self.stop.wait(2.0)
                continue
            while not self.stop.is_set() and self.socket.exists() and self.count_socket.exists():
                self.stop.wait(poll)
            if not self.stop.is_set():
                log.warning(
                    "our socket %s vanished (the kubelet restarted): serving and registering again",
                    self.socket,
                )
                self.shutdown_server()
        self.shutdown_server()

    def _health_loop(self) -> None:
        while not self.stop.is_set():
            try:
                changed = False
                for ev in self.state.backend.health_events(1000):
                    changed = self.state.set_health(ev.uuid, ev.healthy, ev.reason) or changed
                if changed and self.on_health:
                    self.on_health()
            except Exception as err:
                log.warning("health check failed: %s", err)
                time.sleep(1)

    def shutdown(self) -> None:
        self.stop.set()
        with self.state.changed:
            self.state.changed.notify_all()
