"""Simulated GPU nodes: kwok-managed Nodes carrying the resources and the card inventory the
device plugin would write, added to a local cluster and waited for until Ready."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpushare_hub.core.names import CARDS_ANNOTATION

from ..core.cards import Card, cards_to_annotation, declared_cards
from .clusterbase import ClusterBase
from .processes import HarnessError

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


class KwokNodes(ClusterBase):
    """``add_gpu_nodes``, ``add_node``, ``node_object``, ``wait_nodes_ready``."""

    def node_object(
        self,
        name: str,
        cards: Iterable[Card],
        cpu: str = "32",
        memory: str = "128Gi",
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """A kwok-managed Node carrying our resources and card inventory, as the plugin would."""
        cards = tuple(cards)
        units = sum(c.units for c in cards)
        resources = {
            "cpu": cpu,
            "memory": memory,
            "pods": "110",
            self.names.memory: str(units),
            self.names.count: str(len(cards)),
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "gpushare": "true",
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **(labels or {}),
                },
                "annotations": {
                    KWOK_NODE_ANNOTATION: "fake",
                    "node.alpha.kubernetes.io/ttl": "0",
                    CARDS_ANNOTATION: cards_to_annotation(cards),
                },
            },
            "status": {"capacity": resources, "allocatable": resources},
        }

    def add_node(self, name: str, cards: Iterable[Card], **kw: Any) -> dict[str, Any]:
        body = self.node_object(name, cards, **kw)
        self.core_api().create_node(body)
        return body

    def add_gpu_nodes(
        self,
        count: int,
        cards: int = 2,
        model: str = "Tesla T4",
        mib: int = 15360,
        prefix: str = "gpu-",
        start: int = 1,
        wait: bool = True,
        **kw: Any,
    ) -> list[str]:
        """``count`` kwok nodes with ``cards`` identical cards each; waits until they are Ready."""
        names = [f"{prefix}{i}" for i in range(start, start + count)]
        for name in names:
            self.add_node(name, declared_cards(name, cards, model, mib, self.names), **kw)
        if wait:
            self.wait_nodes_ready(names)
        return names

    def wait_nodes_ready(self, names: Iterable[str], timeout: float = 120) -> None:
        pending = set(names)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for node in self.get_json("/api/v1/nodes")["items"]:
                conds = (node.get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                    pending.discard(node["metadata"]["name"])
            if pending:
                time.sleep(0.3)
        if pending:
            raise HarnessError(
                f"{len(pending)} node(s) not Ready after {timeout}s (e.g. {sorted(pending)[:3]}); "
                f"kwok log {self.components['kwok'].log}"
            )
