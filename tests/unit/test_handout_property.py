"""No swapped card, for any pod shape and admission order: the extender's decisions and the
plugin's matching, driven together through random placements, admissions and deletions."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpushare_hub.core import Ledger, Placement, PodObject
from gpushare_hub.core.names import ALLOCATION_ANNOTATION, GPU_MEM_ASSIGNED
from gpushare_hub.extender.decisions import Decisions
from gpushare_hub.plugin.backends import SimulatedBackend
from gpushare_hub.plugin.devices import device_ids
from gpushare_hub.plugin.matching import COUNT
from gpushare_hub.plugin.settings import Settings
from gpushare_hub.plugin.state import PluginState, PodSource
from tests.objects import read_node, read_pod, read_pods

from .helpers import node_obj, pod_obj

NODE = "gpu-1"


class ApiPods(PodSource):
    """The API server's pods of the node; marks are applied and shown to the ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.ledger = ledger

    def pods_on_node(self, node: str) -> list[PodObject]:
        return read_pods(p for p in self.pods.values() if p["spec"].get("nodeName") == node)

    def mark_assigned(self, namespace: str, name: str, uid: str) -> None:
        pod = self.pods[f"{namespace}/{name}"]
        pod["metadata"]["annotations"][GPU_MEM_ASSIGNED] = "true"
        self.ledger.observe_pod(read_pod(pod))


def container(name: str, units: int) -> dict[str, Any]:
    limits = {"aliyun.com/gpu-mem": str(units)} if units else {}
    return {"name": name, "resources": {"limits": limits}}


@st.composite
def pod_shapes(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.integers(0, 4)) == 0:  # whole cards by aliyun.com/gpu-count alone
        return {"app": [0], "init": [], "count": draw(st.integers(1, 2)), "whole": True}
    app = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    init = draw(st.lists(st.integers(0, 3), max_size=1))
    two_cards = draw(st.booleans()) and sum(app) % 2 == 0 and sum(app) > 0 and not any(init)
    return {"app": app, "init": init, "count": 2 if two_cards else None}


def build(name: str, shape: dict[str, Any]) -> dict[str, Any]:
    pod = pod_obj(
        name,
        containers=[container(f"c{i}", u) for i, u in enumerate(shape["app"])],
        init=[container(f"i{i}", u) for i, u in enumerate(shape["init"])] or None,
    )
    if shape.get("whole"):
        pod["spec"]["containers"][0]["resources"]["limits"] = {"aliyun.com/gpu-count": str(shape["count"])}
    elif shape["count"]:
        pod["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-count"] = str(shape["count"])
    return pod


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cards=st.integers(2, 4),
    shapes=st.lists(pod_shapes(), min_size=2, max_size=12),
    script=st.lists(
        st.tuples(st.sampled_from(["place", "admit", "delete"]), st.integers(0, 99)), max_size=60
    ),
)
def test_every_container_gets_the_card_the_extender_wrote(cards, shapes, script):
    node = node_obj(NODE, cards=cards, mib=6 * 1024)  # small 6 GiB cards: holds and waits happen
    node["metadata"]["annotations"]["gpushare-hub.io/allocator"] = "gpushare-device-plugin"
    ledger = Ledger()
    ledger.observe_node(read_node(node))
    decisions = Decisions(ledger)
    api = ApiPods(ledger)
    backend = SimulatedBackend(f"{cards}x Tesla T4:{6 * 1024}", NODE)
    # the plugin and the ledger must name the same cards
    uuids = [c.uuid for c in backend.discover()]
    node["metadata"]["annotations"]["gpushare-hub.io/cards"] = json.dumps(
        [{"uuid": u, "index": i, "model": "Tesla-T4", "mib": 6144, "units": 6} for i, u in enumerate(uuids)]
    )
    ledger.observe_node(read_node(node))
    plugin = PluginState(backend, api, Settings(node=NODE))
    every_id = [i for c in plugin.cards for i in device_ids(c)]
    unplaced = {f"jhub/p{i}": build(f"p{i}", s) for i, s in enumerate(shapes)}
    placed: list[str] = []
    for action, pick in script:
        if action == "place" and unplaced:
            key = sorted(unplaced)[pick % len(unplaced)]
            decision = decisions.bind(read_pod(unplaced[key]), NODE)
            if isinstance(decision, Placement):
                pod = unplaced.pop(key)
                pod["spec"]["nodeName"] = NODE
                units = decisions.card_units(decision)
                pod["metadata"]["annotations"].update(decision.record().pod_annotations(units, len(placed)))
                api.pods[key] = pod
                ledger.observe_pod(read_pod(pod))
                placed.append(key)
        elif action == "admit" and placed:
            key = placed.pop(pick % len(placed))  # the kubelet admits placed pods in any order
            pod = api.pods[key]
            record = json.loads(pod["metadata"]["annotations"][ALLOCATION_ANNOTATION])
            for c in (pod["spec"].get("initContainers") or []) + pod["spec"]["containers"]:
                n = int(c["resources"]["limits"].get("aliyun.com/gpu-count", "0"))
                if n:  # the kubelet's gpu-count Allocate: any n card devices
                    env = plugin.allocate(plugin.preferred_count(uuids, [], n), COUNT).envs
                    if "aliyun.com/gpu-mem" not in c["resources"]["limits"]:
                        want = ",".join(x["uuid"] for x in record["cards"])
                        assert env["NVIDIA_VISIBLE_DEVICES"] == want, (key, c["name"])
                mine = [x for x in record["containers"] if x["name"] == c["name"]]
                if not mine:
                    continue
                size = sum(x["units"] for x in mine)
                ids = plugin.preferred(every_id, [], size)
                env = plugin.allocate(ids).envs
                assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(x["uuid"] for x in mine), (key, c["name"])
        elif action == "delete" and placed:
            key = placed.pop(pick % len(placed))
            pod = api.pods.pop(key)
            ledger.observe_pod(read_pod(pod), deleted=True)
    assert ledger.overcommitted() == []
