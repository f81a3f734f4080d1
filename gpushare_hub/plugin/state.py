"""The device plugin's state: the node's cards, their health, and the allocation logic.

It knows nothing of gRPC sockets or the kubelet's registration; the servicer
(:mod:`.servicer`) translates calls to it, and :mod:`.registration` keeps it served.
One state answers both resources, ``aliyun.com/gpu-mem`` (one device per unit of a card)
and ``aliyun.com/gpu-count`` (one device per card, its ID the card UUID).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from pathlib import Path

from gpushare_hub.core.cards import Card, Node
from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.objects import PodObject
from gpushare_hub.core.overcommit import held_units
from gpushare_hub.core.records import Ignored, IgnoredRecord

from .api import deviceplugin_v1beta1_pb2 as pb
from .backends import Backend
from .devices import device_ids, preferred, units_of
from .doors import Doors
from .matching import COUNT, MEMORY, NoMatch, Waiting, match, waiting_containers
from .response import ContainerResponse, container_response, whole_card_response, with_door
from .served import ServedContainers
from .settings import Settings

log = logging.getLogger("gpushare.plugin")


class PodSource:
    """How the plugin reads the pods of its node and marks them served (the API server)."""

    def pods_on_node(self, node: str) -> list[PodObject]:
        raise NotImplementedError

    def mark_assigned(self, namespace: str, name: str, uid: str) -> None:
        raise NotImplementedError


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
        self._lock = threading.Lock()
        self._warned: set[tuple[str, Ignored]] = set()  # ignored records already logged
        self.served = ServedContainers(settings.served_file)
        # Overcommit (core/overcommit.py): each card's units as declared to the extender (set by the
        # hibernation keeper; real until then), and the pods' doors.
        self.declared: dict[str, int] = {}
        oc = settings.overcommit
        self.doors = Doors(Path(settings.hibernation_dir)) if oc.on and settings.hibernation_dir else None
        self._ids = {
            MEMORY: frozenset(i for c in self.cards for i in device_ids(self.held(c))),
            COUNT: frozenset(c.uuid for c in self.cards),
        }

    def _mark_served_pods(self) -> None:
        """Write ASSIGNED=true on fully served pods; then the API server remembers for us.

        A failed write keeps the pod's containers served (they must not match again)
        and is retried on the next Allocate.
        """
        for uid, key in list(self.served.unmarked.items()):
            namespace, name = key.split("/", 1)
            try:
                self.pods.mark_assigned(namespace, name, uid)
            except Exception as err:
                log.warning("could not mark pod %s assigned (will retry): %s", key, err)
                continue
            with self._lock:
                self.served.forget_pod(uid)

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

    def held(self, card: Card) -> Card:
        """The card with the units its slices may hold together: factor x its units on an
        overcommitted node (what the kubelet is offered), its units elsewhere."""
        return replace(card, units=held_units(card.units, self.settings.overcommit.factor))

    def ledger_node(self) -> Node:
        """This node with every card at its held units: what pods' records are read against."""
        return Node(self.settings.node, tuple(self.held(c) for c in self.inventory()))

    def published_cards(self) -> list[Card]:
        """The cards as the Node declares them to the extender (gpushare-hub.io/cards): on an
        overcommitted node each at its memory plus the hibernated slices counted on it."""
        return [replace(c, units=self.declared.get(c.uuid, c.units)) for c in self.inventory()]

    def devices(self) -> list[pb.Device]:
        out: list[pb.Device] = []
        for c in self.cards:
            state = "Healthy" if self.health[c.uuid] else "Unhealthy"
            out.extend(pb.Device(ID=i, health=state) for i in device_ids(self.held(c)))
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
        out = waiting_containers(
            self.pods.pods_on_node(self.settings.node),
            self.ledger_node(),
            self.served.keys,
            self.settings.names,
            ignored,
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

    def served_ids(self, resource: str = MEMORY) -> frozenset[str]:
        """Every device ID this plugin announces for ``resource`` (healthy or not): the IDs
        :mod:`.requests` accepts in a request."""
        return self._ids[resource]

    def _claim(self, ids: list[str], resource: str) -> Waiting:
        """The waiting container these IDs serve, recorded as served (on disk before the answer)."""
        with self._lock:
            waiting = self._waiting()
            w = match(ids, waiting, self.settings.node, self.settings.names.unit, resource)
            sick = [u for u in (w.cards or (w.uuid,)) if not self.card(u).healthy]
            if sick:
                raise NoMatch(
                    f"pod {w.pod} container {w.container}: card {', '.join(sick)} on node "
                    f"{self.settings.node} is unhealthy; it is not handed out. Delete the pod so that "
                    "it is placed on a healthy card"
                )
            if self.doors is not None and resource == MEMORY:
                self._open_door(w)
            served = self.served
            served.keys.add((w.uid, w.served_key))
            rest = [x for x in waiting if x.uid == w.uid and (x.uid, x.served_key) not in served.keys]
            if not rest:
                served.unmarked[w.uid] = w.pod
            served.save()
        return w

    def _open_door(self, w: Waiting) -> None:
        assert self.doors is not None
        try:
            self.doors.open(w.uid)
        except (OSError, ValueError) as err:
            raise GPUShareError(
                f"pod {w.pod} container {w.container}: cannot make its hibernation door under "
                f"{self.doors.root} on node {self.settings.node} ({err}); mount that host folder into "
                "the plugin's container (--hibernation-dir), or run the node with --overcommit 1"
            ) from err

    def _response(self, w: Waiting, resource: str) -> ContainerResponse:
        if resource == COUNT:
            response = whole_card_response(w, self.settings.isolation)
            log.info(
                "allocated whole card(s) %s to pod %s container %s", ",".join(w.cards), w.pod, w.container
            )
            return response
        card = self.card(w.uuid)
        response = container_response(w, card, self.settings.names.mib_per_unit, self.settings.isolation)
        if self.doors is not None:
            response = with_door(response, str(self.doors.door(w.uid)), str(self.doors.answer_dir(w.uid)))
        log.info(
            "allocated %s units of card %d (%s) to pod %s container %s",
            w.units,
            card.index,
            card.uuid,
            w.pod,
            w.container,
        )
        return response

    def allocate(self, ids: list[str], resource: str = MEMORY) -> ContainerResponse:
        """One container's Allocate answer for ``resource`` (MEMORY: gpu-mem units; COUNT:
        gpu-count whole cards); marks the pod assigned when all its containers are served.
        ``ids``: read by :func:`.requests.read_allocate` (IDs this plugin serves)."""
        w = self._claim(ids, resource)
        response = self._response(w, resource)
        self._mark_served_pods()
        return response
