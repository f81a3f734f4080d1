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
from typing import Any

from .errors import InvalidObject
from .jsonfields import load_annotation_json
from .names import MPS_LABEL, MPS_MULTI_USER_LABEL, MPS_SERVERS_ANNOTATION


@dataclass(frozen=True)
class NodeMPS:
    enabled: bool = False
    multi_user: bool = False
    servers: Mapping[str, int] | None = None  # card UUID -> UID of its running MPS server

    def server_uid(self, card: str) -> int | None:
        return (self.servers or {}).get(card)


def _is_uid(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def node_mps(node: Mapping[str, Any]) -> NodeMPS:
    """Read a Node object; entries that are not ``UUID: non-negative integer`` are ignored."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(MPS_LABEL) != "true":
        return NodeMPS()
    servers: dict[str, int] = {}
    raw = (meta.get("annotations") or {}).get(MPS_SERVERS_ANNOTATION)
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


def pod_run_as_user(pod: Mapping[str, Any], container: str | None = None) -> int | None:
    """The UID a pod's container runs as, where the pod says (container over pod securityContext)."""
    spec = pod.get("spec") or {}
    uid = (spec.get("securityContext") or {}).get("runAsUser")
    for c in spec.get("containers") or []:
        if container is None or c.get("name") == container:
            own = (c.get("securityContext") or {}).get("runAsUser")
            if own is not None:
                uid = own
            if container is not None:
                break
    return uid if _is_uid(uid) else None


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


def uid_mismatches(
    mps: NodeMPS, node: str, pod: Mapping[str, Any], cards: Iterable[str]
) -> list[UIDMismatch]:
    """The clashes of a pod with the MPS servers of the cards it was given (none when unknown)."""
    if not mps.enabled or mps.multi_user:
        return []
    uid = pod_run_as_user(pod)
    if uid is None:
        return []
    meta = pod.get("metadata") or {}
    key = f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}"
    out = []
    for card in cards:
        server = mps.server_uid(card)
        if server is not None and server != uid:
            out.append(UIDMismatch(key, node, card, server, uid))
    return out
