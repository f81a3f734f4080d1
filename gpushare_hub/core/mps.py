"""NVIDIA MPS on a node, as the device plugin publishes it, and the UID clash it can cause (pure).

An MPS server runs as one Unix user. A client of another UID does not fail: the control
daemon queues it until every client of the current server has exited, so a notebook of
UID 1001 on a card whose MPS server runs for UID 1000 hangs at its first CUDA call.
Daemons started multi-user (``-M``, Volta or newer) serve every UID through one root server.

What the plugin publishes on its Node:

* label ``gpushare-hub.io/mps=true``: MPS caps pods on this node (and selects the node
  for the control-daemon DaemonSet); ``gpushare-hub.io/mps-multi-user=true``: its daemons
  run ``-M``;
* annotation ``gpushare-hub.io/mps-servers``: ``{"<card UUID>": <UID>}``, the UID each
  card's MPS server runs for right now (cards with no server are absent).

The extender warns a pod bound to a card whose server runs for another UID, and the
spawner can show the same :class:`UIDMismatch` text before the user waits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .errors import InvalidObject
from .jsonfields import load_annotation_json
from .names import MPS_LABEL, MPS_MULTI_USER_LABEL, MPS_SERVERS_ANNOTATION
from .objects import NodeObject, PodObject


@dataclass(frozen=True)
class NodeMPS:
    enabled: bool = False
    multi_user: bool = False
    servers: Mapping[str, int] | None = None  # card UUID -> UID of its running MPS server

    def server_uid(self, card: str) -> int | None:
        return (self.servers or {}).get(card)


def node_mps(node: NodeObject) -> NodeMPS:
    """A Node's MPS servers; entries that are not ``UUID: non-negative integer`` are ignored."""
    labels = node.labels
    if labels.get(MPS_LABEL) != "true":
        return NodeMPS()
    servers: dict[str, int] = {}
    raw = node.annotations.get(MPS_SERVERS_ANNOTATION)
    if raw:
        try:
            value = load_annotation_json(raw, f"annotation {MPS_SERVERS_ANNOTATION}", "ignored")
        except InvalidObject:
            value = None
        if isinstance(value, dict):
            servers = {
                str(k): v
                for k, v in value.items()
                if isinstance(v, int) and not isinstance(v, bool) and v >= 0
            }
    return NodeMPS(True, labels.get(MPS_MULTI_USER_LABEL) == "true", servers)


def pod_run_as_user(pod: PodObject, container: str | None = None) -> int | None:
    """The UID a pod's container runs as, where the pod says (container over pod securityContext)."""
    uid = pod.run_as_user
    for c in pod.containers:
        if container is None or c.name == container:
            if c.run_as_user is not None:
                uid = c.run_as_user
            if container is not None:
                break
    return uid


@dataclass(frozen=True)
class UIDMismatch:
    """A pod placed on a card whose MPS server runs for another UID: it would wait, silently."""

    pod: str
    node: str
    card: str
    server_uid: int
    pod_uid: int

    def message(self) -> str:
        return (
            f"card {self.card} on node {self.node} runs MPS for UID {self.server_uid}; pod {self.pod} runs "
            f"as UID {self.pod_uid}, so its first CUDA call waits until every program of UID "
            f"{self.server_uid} on that card has exited. Run the node's MPS daemons multi-user "
            f"(plugin option mpsMultiUser, Volta or newer), or run notebooks as UID {self.server_uid}."
        )


def uid_mismatches(mps: NodeMPS, node: str, pod: PodObject, cards: Iterable[str]) -> list[UIDMismatch]:
    """The clashes of a pod with the MPS servers of the cards it was given (none when unknown)."""
    if not mps.enabled or mps.multi_user:
        return []
    uid = pod_run_as_user(pod)
    if uid is None:
        return []
    key = pod.key
    out = []
    for card in cards:
        server = mps.server_uid(card)
        if server is not None and server != uid:
            out.append(UIDMismatch(key, node, card, server, uid))
    return out
