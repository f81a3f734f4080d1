"""The kube-scheduler extender v1 wire format (``k8s.io/kube-scheduler/extender/v1``).

kube-scheduler marshals Go structs without json tags, so keys arrive capitalised
(``Pod``, ``Nodes``, ``NodeNames``); older clients and tutorials send lower-case.
Both are accepted, and replies use the capitalised names. Every malformed body
raises :class:`BadRequest` with a message naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_hub.core.errors import InvalidObject
from gpushare_hub.core.objects import PodObject
from gpushare_hub.core.shapes import MAX_NAME, check_depth, read_node, read_pod, shown

# The largest candidate list a 5,000-node cluster sends (kube-scheduler sends every feasible node).
MAX_NODES = 10_000


class BadRequest(ValueError):
    """The request body is not what the verb takes; answered with HTTP 400."""


def _field(body: Mapping[str, Any], name: str) -> Any:
    """``body[name]`` whatever the case of its first letter (Go's decoder ignores case)."""
    if name in body:
        return body[name]
    lowered = name.lower()
    for key, value in body.items():
        if isinstance(key, str) and key.lower() == lowered:
            return value
    return None


def load(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequest(f"body is not JSON: {err}") from err
    except RecursionError:
        raise BadRequest("body nests too deeply to be a request") from None
    if not isinstance(body, dict):
        raise BadRequest(f"body must be a JSON object, got {type(body).__name__}")
    try:
        check_depth(body)
    except InvalidObject as err:
        raise BadRequest(str(err)) from None
    return body


@dataclass(frozen=True)
class ExtenderArgs:
    """Filter and prioritize input: the pod (read by :func:`~gpushare_hub.core.shapes.read_pod`)
    and the candidate nodes."""

    pod: PodObject
    node_names: list[str]
    nodes: list[dict[str, Any]] | None  # full Node objects when nodeCacheCapable is false, as sent

    @classmethod
    def parse(cls, raw: bytes) -> ExtenderArgs:
        body = load(raw)
        pod = _field(body, "Pod")
        if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
            raise BadRequest("field Pod is missing or is not a Pod object with metadata")
        names = _field(body, "NodeNames")
        nodes = _field(body, "Nodes")
        node_objs: list[dict[str, Any]] | None = None
        try:
            typed = read_pod(pod, "Pod")
            if names is not None:
                _node_names(names)
            elif nodes is not None:
                items = nodes.get("items") if isinstance(nodes, dict) else None
                if not isinstance(items, list):
                    raise BadRequest("field Nodes must be a NodeList: an object with a list of items")
                if len(items) > MAX_NODES:
                    raise BadRequest(f"field Nodes has {len(items)} items, more than {MAX_NODES}")
                names = [read_node(n, f"Nodes.items[{i}]").name for i, n in enumerate(items)]
                node_objs = items
            else:
                raise BadRequest("neither NodeNames nor Nodes is set; send the candidate nodes")
        except InvalidObject as err:
            raise BadRequest(str(err)) from None
        return cls(pod=typed, node_names=list(names), nodes=node_objs)


def _node_names(names: object) -> None:
    if not isinstance(names, list):
        raise BadRequest(f"field NodeNames must be a list of node names, got {shown(names)}")
    if len(names) > MAX_NODES:
        raise BadRequest(f"field NodeNames has {len(names)} names, more than {MAX_NODES}")
    if not names or (
        set(map(type, names)) == {str} and 0 < min(map(len, names)) <= max(map(len, names)) <= MAX_NAME
    ):
        return  # every name well-formed, checked in C: a filter for 1,000 nodes pays microseconds
    for i, n in enumerate(names):
        if not isinstance(n, str) or not n or len(n) > MAX_NAME:
            raise BadRequest(f"field NodeNames[{i}] is {shown(n)}, not a node name")


@dataclass(frozen=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @classmethod
    def parse(cls, raw: bytes) -> BindingArgs:
        body = load(raw)
        values = {}
        for name in ("PodName", "PodNamespace", "PodUID", "Node"):
            v = _field(body, name)
            if name == "PodUID" and v is None:
                v = ""
            if not isinstance(v, str) or (name != "PodUID" and not v):
                raise BadRequest(f"field {name} is missing or not a non-empty string: {shown(v)}")
            if len(v) > MAX_NAME:
                raise BadRequest(f"field {name} has {len(v)} characters, more than {MAX_NAME}")
            values[name] = v
        return cls(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])


def filter_result(
    args: ExtenderArgs,
    passed: list[str],
    failed: Mapping[str, str],
    unresolvable: Mapping[str, str],
    error: str = "",
) -> dict[str, Any]:
    """``ExtenderFilterResult``: names (nodeCacheCapable) or full nodes, as the request came."""
    out: dict[str, Any] = {
        "NodeNames": None,
        "Nodes": None,
        "FailedNodes": dict(failed),
        "FailedAndUnresolvableNodes": dict(unresolvable),
        "Error": error,
    }
    if args.nodes is None:
        out["NodeNames"] = passed
    else:
        keep = set(passed)
        out["Nodes"] = {"items": [n for n in args.nodes if n["metadata"]["name"] in keep]}
    return out


def priority_list(scores: Mapping[str, int], order: list[str]) -> list[dict[str, Any]]:
    """``HostPriorityList`` in the order the nodes came; nodes without a score get 0."""
    return [{"Host": n, "Score": int(scores.get(n, 0))} for n in order]
