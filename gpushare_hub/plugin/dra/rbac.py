"""What gpushare-dra-plugin does with the API server, as RBAC rules (the chart's ClusterRole is
generated from them by helm/generate.py): read the claims it prepares (any namespace); publish,
check and delete its node's ResourceSlice (the chart's admission policy keeps it to its own node);
read its Node and write the cards, isolation and usage annotations on it; list the node's pods
(the usage loop and the self-test) and write Warning events (the device plugin's own sinks); read
the node options ConfigMap (a namespaced Role in the chart)."""

from __future__ import annotations

from typing import Any

RBAC_RULES: list[dict[str, Any]] = [
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "list"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]},
]
