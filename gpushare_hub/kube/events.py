"""The Warning events our components write on Pods and Nodes, built in one place (pure: the
callers post them with their own client)."""

from __future__ import annotations

import datetime as dt
from typing import Any


def warning_event(
    involved: dict[str, str], namespace: str, reason: str, message: str, component: str, host: str = ""
) -> dict[str, Any]:
    """A core/v1 Warning Event on ``involved`` (kind, name, uid and, for a pod, namespace). As the
    kubelet's own Node events do, a Node's name stands for its UID, so `kubectl describe node`
    finds it."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    source = {"component": component, **({"host": host} if host else {})}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", **involved},
        "type": "Warning",
        "reason": reason,
        "message": message,
        "source": source,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
