"""Reading what the extender did in the local cluster: its scheduler's name (``SCHED``), the pods
of a namespace and the ones bound, a pod's allocation record and events, the extender's
``/inspect`` answer, and the ledger rebuilt from the API server with no card overcommitted."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from gpushare_hub.core import Ledger
from gpushare_hub.core.names import ALLOCATION_ANNOTATION
from tests.objects import read_nodes, read_pods

SCHED = "gpushare-scheduler"


def pods_in(cluster, namespace) -> list[dict[str, Any]]:
    return cluster.get_json(f"/api/v1/namespaces/{namespace}/pods")["items"]


def allocation(pod: dict[str, Any]) -> dict[str, Any] | None:
    ann = (pod["metadata"].get("annotations") or {}).get(ALLOCATION_ANNOTATION)
    return json.loads(ann) if ann else None


def bound(cluster, namespace, count) -> list[dict[str, Any]] | None:
    pods = pods_in(cluster, namespace)
    done = [p for p in pods if p["spec"].get("nodeName")]
    return done if len(done) >= count else None


def events_for(cluster, namespace, pod) -> list[str]:
    evs = cluster.core_api().list_namespaced_event(namespace, field_selector=f"involvedObject.name={pod}")
    return [f"{e.reason}: {e.message}" for e in evs.items]


def inspect(url: str, node: str | None = None) -> dict[str, Any]:
    with urllib.request.urlopen(url + ("/inspect/" + node if node else "/inspect"), timeout=30) as r:
        return json.loads(r.read())


def check_no_overcommit_from_the_api_server(cluster, nodes: list[str]) -> Ledger:
    """Rebuild a ledger from what the API server holds and check every card."""
    all_nodes = cluster.get_json("/api/v1/nodes")["items"]
    all_pods = cluster.get_json("/api/v1/pods")["items"]
    ledger = Ledger.from_objects(
        read_nodes([n for n in all_nodes if n["metadata"]["name"] in nodes]), read_pods(all_pods)
    )
    assert ledger.overcommitted() == []
    return ledger
