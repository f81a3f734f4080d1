"""The API permissions the extender needs, in one place (the chart and the tests use this)."""

from __future__ import annotations

from typing import Any

RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    # The ledger counts the DRA path's claims too (docs/dra.md).
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["list", "watch"]},
    # The prioritize-only verb of the DRA packing reads what a DRA pod's claim template asks.
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaimtemplates"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods/binding", "bindings"], "verbs": ["create"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    # --leader-elect: the Lease that lets one replica bind.
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
]


def cluster_role(
    name: str = "gpushare-extender", rules: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": RULES if rules is None else rules,
    }


def cluster_role_binding(subject: dict[str, Any], name: str = "gpushare-extender") -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [subject],
    }
