"""`kubectl inspect gpushare`'s test cluster: pods placed on declared cards (``placed``), the
nodes and pods its tables are checked against (``fixture_cluster``), and a tabwriter table split
into cells (``columns``)."""

from __future__ import annotations

from typing import Any

from gpushare_hub.core.annotations import AllocationRecord, CardShare
from gpushare_hub.core.cards import declared_cards
from gpushare_hub.core.names import ALLOCATION_ANNOTATION, HUB_SERVER_ANNOTATION, HUB_USER_ANNOTATION
from tests.unit.helpers import node_obj, pod_obj


def placed(name: str, units: int, node: str, idx: int, user: str = "", server: str = "") -> dict[str, Any]:
    card = declared_cards(node, 2, "Tesla T4", 15360)[idx]
    rec = AllocationRecord(
        node=node, cards=(CardShare(uuid=card.uuid, index=idx, units=units),), containers=()
    )
    ann = {ALLOCATION_ANNOTATION: rec.to_json()}
    if user:
        ann[HUB_USER_ANNOTATION] = user
        ann[HUB_SERVER_ANNOTATION] = server
    return pod_obj(name, units, node=node, annotations=ann, phase="Running")


def fixture_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    a = node_obj("gpu-a")
    a["status"]["addresses"] = [
        {"type": "Hostname", "address": "gpu-a"},
        {"type": "InternalIP", "address": "10.0.0.1"},
    ]
    cpu_only = {"metadata": {"name": "cpu-1"}, "status": {"capacity": {"cpu": "8"}}}
    pods = [
        placed("jupyter-alice", 5, "gpu-a", 0, "alice"),
        placed("jupyter-bob", 5, "gpu-a", 0, "bob", "big"),
        placed("jupyter-carol", 7, "gpu-a", 1, "carol"),
        # placed by Aliyun's extender: card index only
        pod_obj(
            "legacy",
            3,
            node="gpu-b",
            annotations={"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "3"},
            phase="Running",
        ),
        # bound to a node without any card (bypassed the extender): Aliyun's PENDING column
        pod_obj("bypassed", 2, node="gpu-b", phase="Running"),
        pod_obj("finished", 9, node="gpu-b", phase="Succeeded"),
        pod_obj("cpu-pod", None, node="cpu-1", phase="Running"),
        pod_obj("jupyter-dave", 16),
    ]
    pods[-1]["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/2 nodes are available: 2 no card has 16 GiB free.",
        }
    ]
    return [a, node_obj("gpu-b"), cpu_only], pods


def columns(table: list[str]) -> list[list[str]]:
    """Split tabwriter lines into cells at the header's column starts."""
    header = table[0]
    starts = [0] + [
        i
        for i in range(1, len(header))
        if header[i - 1] == " " and header[i] != " " and header[i - 2 : i] == "  "
    ]
    return [[line[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)] for line in table]
