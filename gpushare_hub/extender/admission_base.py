"""What the admission policies of :mod:`.admission` and :mod:`.admission_runtime` share: who is
who (:class:`Identities`), CEL literals, the callers' variables, and a policy's and a binding's
shape."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


@dataclass(frozen=True)
class Identities:
    """Who is who, as the API server names the callers (``request.userInfo.username``)."""

    extender: Sequence[str] = ("system:serviceaccount:gpushare-hub:gpushare-extender",)
    plugin: Sequence[str] = ("system:serviceaccount:gpushare-hub:gpushare-device-plugin",)
    # kubeadm's admin.conf is in kubeadm:cluster-admins since Kubernetes 1.29, not system:masters.
    admin_groups: Sequence[str] = ("system:masters", "kubeadm:cluster-admins")
    allow_user_policy: bool = False
    # Identities that may set gpushare-hub.io/policy when users may not (e.g. the hub's, for
    # an admin's per-profile policy).
    policy_setters: Sequence[str] = ()
    # Namespaces whose pods may choose cards through the NVIDIA runtime (its variables, its
    # RuntimeClasses): our own (the device plugin, the MPS daemons), the cluster's, the GPU Operator's.
    exempt_namespaces: Sequence[str] = ("gpushare-hub", "kube-system", "gpu-operator")
    # RuntimeClasses whose runtime hands a container the cards its environment (or its image's) names:
    # the GPU Operator's.
    runtime_classes: Sequence[str] = ("nvidia", "nvidia-cdi", "nvidia-legacy")
    name: str = "gpushare-hub"
    extra_labels: dict[str, str] = field(default_factory=dict)


def cel_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(cel_str(v) for v in values) + "]"


def cel_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def admin_variable(ids: Identities) -> dict[str, str]:
    """CEL variable ``isAdmin``: the caller is in one of the admin groups."""
    return {
        "name": "isAdmin",
        "expression": f"request.userInfo.?groups.orValue([]).exists(g, g in {cel_list(ids.admin_groups)})",
    }


def caller_variables(ids: Identities) -> list[dict[str, str]]:
    """CEL variables naming the caller: an admin, the extender, a plugin, and a plugin's node."""
    return [
        admin_variable(ids),
        {"name": "isExtender", "expression": f"request.userInfo.username in {cel_list(ids.extender)}"},
        {"name": "isPlugin", "expression": f"request.userInfo.username in {cel_list(ids.plugin)}"},
        {
            # The node a plugin's bound service-account token names ('' if none).
            "name": "tokenNode",
            "expression": (
                f"request.userInfo.?extra[?{cel_str(NODE_NAME_EXTRA)}].orValue([]).size() == 1 ? "
                f"request.userInfo.extra[{cel_str(NODE_NAME_EXTRA)}][0] : ''"
            ),
        },
    ]


def rule(resources: list[str], operations: Sequence[str] = ("CREATE", "UPDATE")) -> dict[str, Any]:
    """A resource rule on core (v1) ``resources``."""
    return {"apiGroups": [""], "apiVersions": ["v1"], "operations": list(operations), "resources": resources}


def policy(
    ids: Identities,
    suffix: str,
    rules: list[dict[str, Any]],
    variables: list[dict[str, str]],
    validations: list[dict[str, str]],
) -> dict[str, Any]:
    """A ValidatingAdmissionPolicy on the requests ``rules`` match; failing closed."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": f"{ids.name}-{suffix}", "labels": dict(ids.extra_labels)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "variables": variables,
            "validations": validations,
        },
    }


def binding(policy: dict[str, Any]) -> dict[str, Any]:
    name = policy["metadata"]["name"]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": dict(policy["metadata"]["labels"])},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
