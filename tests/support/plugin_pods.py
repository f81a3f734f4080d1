"""Pods as the device plugin sees them, without an API server: a pod the extender placed on a card
(``placed``), the two-card node ``NODE`` they are placed on, and a pod source held in memory
(``MemoryPods``) that records which pods the plugin marked assigned."""

from __future__ import annotations

from gpushare_hub.core import AllocationRecord, CardShare, ContainerShare
from gpushare_hub.core.cards import Card, Node
from gpushare_hub.plugin.state import PodSource
from tests.objects import read_pods
from tests.unit.helpers import pod_obj


def placed(name: str, uuid: str, units: int, node: str = "gpu-1", assume: int = 1, containers=None, uid=None):
    rec = AllocationRecord(
        node,
        (CardShare(uuid, 0, units),),
        tuple(ContainerShare(c, uuid, u) for c, u in (containers or [("notebook", units)])),
    )
    ann = rec.pod_annotations({uuid: 15}, assume)
    return pod_obj(name, units, node=node, annotations=ann, phase="Pending", uid=uid or f"uid-{name}")


NODE = Node("gpu-1", (Card(0, "GPU-0", "Tesla-T4", 15, 15360), Card(1, "GPU-1", "Tesla-T4", 15, 15360)))


class MemoryPods(PodSource):
    def __init__(self, pods):
        self.pods, self.assigned = pods, []

    def pods_on_node(self, node):
        return read_pods(self.pods)

    def mark_assigned(self, namespace, name, uid):
        self.assigned.append(f"{namespace}/{name}")
