"""The extender's line of waiting spawns kept from its watch (core/queue.py's WaitingLine, in
:class:`~gpushare_hub.extender.decisions.Decisions`): pods of its scheduler join it while they
wait with a GPU demand and leave it once bound or gone; nodes bring their labels and taints."""

from __future__ import annotations

import json

from gpushare_hub.core import GPUShareError, NodeObject, PodObject
from gpushare_hub.core.names import HIBERNATION_ANNOTATION
from gpushare_hub.core.queue import waits_for_gpu_only

from .decisions import Decisions


class LineKeeper:
    """Informer handlers that keep ``decisions``' line and node facts current."""

    def __init__(self, decisions: Decisions, scheduler_name: str) -> None:
        self.decisions = decisions
        self.scheduler_name = scheduler_name

    def on_pod(self, etype: str, obj: PodObject) -> None:
        """A pod of our scheduler waiting with a GPU demand joins the line; once bound (by
        anyone) or gone, it leaves."""
        line = self.decisions.line
        waiting = (
            etype != "DELETED"
            and not obj.node_name
            and not obj.deletion_timestamp
            and obj.phase in ("", "Pending")
            and obj.scheduler_name == self.scheduler_name
        )
        if not waiting:
            line.drop(obj.key)
            return
        try:
            demand = self.decisions.demand(obj)
        except GPUShareError:
            return
        if demand is None:
            return
        said = next(
            (c.message for c in obj.conditions if c.type == "PodScheduled" and c.status == "False"), ""
        )
        names = self.decisions.names
        line.seen(
            obj.key,
            obj.creation_timestamp,
            demand,
            selector=obj.node_selector,
            gpu_only=waits_for_gpu_only(said, (names.memory, names.count)),
            tolerations=obj.tolerations,
        )

    def on_node(self, etype: str, obj: NodeObject) -> None:
        if etype == "DELETED":
            self.decisions.node_labels.pop(obj.name, None)
            self.decisions.node_taints.pop(obj.name, None)
            self.decisions.overcommitted.discard(obj.name)
        else:
            self.decisions.node_labels[obj.name] = dict(obj.labels)
            self.decisions.node_taints[obj.name] = obj.taints
            if overcommits(obj.annotations.get(HIBERNATION_ANNOTATION)):
                self.decisions.overcommitted.add(obj.name)
            else:
                self.decisions.overcommitted.discard(obj.name)


def overcommits(raw: str | None) -> bool:
    """Whether a Node's hibernation annotation says its cards hold more than their memory."""
    try:
        factor = json.loads(raw or "{}").get("factor", 1)
    except (ValueError, AttributeError, RecursionError):
        return False
    return isinstance(factor, int | float) and not isinstance(factor, bool) and factor > 1
