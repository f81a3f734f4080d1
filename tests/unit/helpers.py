"""Builders of Node and Pod objects in the API server's JSON shape, for unit tests."""

from __future__ import annotations

from typing import Any

from gpushare_hub.core import Card
from gpushare_hub.core.cards import cards_to_annotation, declared_cards
from gpushare_hub.core.names import CARDS_ANNOTATION


def node_obj(
    name: str, cards: int = 2, model: str = "Tesla T4", mib: int = 15360, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    cs: tuple[Card, ...] = declared_cards(name, cards, model, mib)
    return {
        "metadata": {
            "name": name,
            "labels": labels or {"gpushare": "true"},
            "annotations": {CARDS_ANNOTATION: cards_to_annotation(cs)},
        },
        "status": {
            "capacity": {
                "aliyun.com/gpu-mem": str(sum(c.units for c in cs)),
                "aliyun.com/gpu-count": str(cards),
            }
        },
    }


def pod_obj(
    name: str,
    mem: int | str | None = None,
    *,
    ns: str = "jhub",
    count: int | None = None,
    annotations: dict[str, str] | None = None,
    node: str | None = None,
    uid: str = "",
    phase: str = "Pending",
    init: list[dict[str, Any]] | None = None,
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    limits: dict[str, Any] = {}
    if mem is not None:
        limits["aliyun.com/gpu-mem"] = mem
    if count is not None:
        limits["aliyun.com/gpu-count"] = count
    spec: dict[str, Any] = {
        "containers": containers or [{"name": "notebook", "resources": {"limits": limits}}],
    }
    if init:
        spec["initContainers"] = init
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }
