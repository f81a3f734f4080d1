"""Raw API objects read into the core's typed form, for tests that build them as dicts."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpushare_hub.core.objects import NodeObject, PodObject
from gpushare_hub.core.shapes import read_node, read_pod

__all__ = ["read_node", "read_nodes", "read_pod", "read_pods"]


def read_pods(objs: Iterable[Any]) -> list[PodObject]:
    return [read_pod(o) for o in objs]


def read_nodes(objs: Iterable[Any]) -> list[NodeObject]:
    return [read_node(o) for o in objs]
