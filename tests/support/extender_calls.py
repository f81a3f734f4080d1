"""The extender's calls without a cluster: the ``ExtenderArgs`` kube-scheduler sends for a pod and
node names (``args``), and the pod object our bind leaves in the API server (``annotated``)."""

from __future__ import annotations

import json

from gpushare_hub.core import Placement
from gpushare_hub.extender.wire import ExtenderArgs
from tests.unit.helpers import pod_obj


def args(pod, names, capital=True):
    keys = ("Pod", "Nodes", "NodeNames") if capital else ("pod", "nodes", "nodenames")
    return ExtenderArgs.parse(json.dumps({keys[0]: pod, keys[1]: None, keys[2]: names}).encode())


def annotated(p: Placement, units: dict[str, int] | None = None) -> dict:
    """The pod object as the API server holds it after our bind."""
    ns, name = p.key.split("/")
    ann = p.record().pod_annotations(units or {c.uuid: 15 for c in p.cards}, assume_time_ns=1)
    sizes = {c.units for c in p.cards}
    asks: dict = {"count": len(p.cards)} if len(p.cards) > 1 else {}
    if len(sizes) == 1:
        asks["mem"] = sum(c.units for c in p.cards)
    return pod_obj(
        name, ns=ns, annotations=ann, node=p.node, uid=p.uid or f"uid-{name}", phase="Running", **asks
    )
