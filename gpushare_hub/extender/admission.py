"""The ValidatingAdmissionPolicies that keep users from forging what the backend trusts.

Generated here, from one place, and shipped as a manifest the chart installs
(``gpushare-extender --print-admission-policy``; ``examples/gpushare-admission-policy.yaml``
is its output with the chart's default identities, kept true by a test).

Who may write what (the trust model in docs/security.md and docs/development/architecture.md):

* ``gpushare-hub.io/allocation`` and ``ALIYUN_COM_GPU_MEM_*`` on pods (and in Bindings, through
  ``pods/binding`` and the legacy ``bindings`` resource alike): only the extender's identity. The
  one exception: the device plugin of a node may set ``ALIYUN_COM_GPU_MEM_ASSIGNED`` /
  ``_ASSUME_TIME`` on pods bound to that node.
* ``gpushare-hub.io/cards``, ``/allocator``, ``/mps-servers``, ``/usage``, ``/isolation``,
  ``/isolation-check`` and ``/device-mode`` on Nodes: only the device plugin of that Node.
* ``gpushare-hub.io/policy`` on pods: like the allocation, unless the admin lets users
  choose (``allow_user_policy``; off by default) or names identities that may set it
  (``policy_setters``, e.g. the hub's). The card-model annotations stay
  open to users: they only narrow where their own pod may go.
* The device plugin's identity, whatever it writes, may change only its own Node and
  the pods bound to it, and on pods only those two annotations: as narrow as the
  NodeRestriction admission makes a kubelet. Its node comes from the node name that
  a service-account token bound to the plugin's pod carries
  (``authentication.kubernetes.io/node-name`` in the user's extra), so a plugin that
  runs without such a token may change nothing.
* A pod chooses no card at the container runtime: its variables (``NVIDIA_VISIBLE_DEVICES``, ...)
  and the NVIDIA RuntimeClasses only in ``exempt_namespaces`` (:mod:`.admission_runtime`).
* Members of ``admin_groups`` (``system:masters`` and kubeadm's ``kubeadm:cluster-admins`` by
  default) may repair anything.

The ledger checks what it reads anyway (:mod:`gpushare_hub.core.records`), so a gap
here cannot over-commit a card; this layer stops the forgery where it enters.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpushare_hub.core.names import (
    ALLOCATION_ANNOTATION,
    ALLOCATOR_ANNOTATION,
    CARDS_ANNOTATION,
    CHECKPOINT_ANNOTATION,
    DEVICE_MODE_ANNOTATION,
    GPU_MEM_ASSIGNED,
    GPU_MEM_ASSUME_TIME,
    GPU_MEM_PREFIX,
    HIBERNATION_ANNOTATION,
    ISOLATION_ANNOTATION,
    ISOLATION_CHECK_ANNOTATION,
    MPS_SERVERS_ANNOTATION,
    POLICY_ANNOTATION,
    USAGE_ANNOTATION,
)

from .admission_base import Identities, binding, caller_variables, cel_list, cel_str, policy, rule
from .admission_runtime import runtime_policy

__all__ = ["Identities", "admission_manifests", "admission_yaml"]

PLUGIN_POD_KEYS = (GPU_MEM_ASSIGNED, GPU_MEM_ASSUME_TIME)
# The plugin's reports on its Node: its cards, its allocator mark, what runs on the cards, the
# isolation tier it enforces and its self-test of that tier (slices that require a tier trust it).
NODE_KEYS = (
    CARDS_ANNOTATION,
    ALLOCATOR_ANNOTATION,
    MPS_SERVERS_ANNOTATION,
    USAGE_ANNOTATION,
    ISOLATION_ANNOTATION,
    ISOLATION_CHECK_ANNOTATION,
    DEVICE_MODE_ANNOTATION,
    HIBERNATION_ANNOTATION,
    CHECKPOINT_ANNOTATION,
)


def _changed(protected: str) -> str:
    """CEL: the annotation keys matching ``protected`` (a predicate on ``k``) set, changed or removed."""
    return (
        f"variables.ann.filter(k, ({protected}) && "
        "(!(k in variables.oldAnn) || variables.oldAnn[k] != variables.ann[k])) + "
        f"variables.oldAnn.filter(k, ({protected}) && !(k in variables.ann))"
    )


def _common_variables(ids: Identities) -> list[dict[str, str]]:
    return [
        {"name": "ann", "expression": "object.metadata.?annotations.orValue({})"},
        {
            "name": "oldAnn",
            "expression": "oldObject == null ? {} : oldObject.metadata.?annotations.orValue({})",
        },
        *caller_variables(ids),
    ]


def _pod_policy(ids: Identities) -> dict[str, Any]:
    protected = f"k == {cel_str(ALLOCATION_ANNOTATION)} || k.startsWith({cel_str(GPU_MEM_PREFIX)})"
    what = f"{ALLOCATION_ANNOTATION} and {GPU_MEM_PREFIX}*"
    if not ids.allow_user_policy:
        protected += f" || k == {cel_str(POLICY_ANNOTATION)}"
        what += f" and {POLICY_ANNOTATION}"
    extenders = ", ".join(ids.extender)
    plugins = ", ".join(ids.plugin)
    plugin_keys = cel_list(PLUGIN_POD_KEYS)
    setters = (
        f" || (request.userInfo.username in {cel_list(ids.policy_setters)} && "
        f"variables.changed.all(k, k == {cel_str(POLICY_ANNOTATION)}))"
        if ids.policy_setters and not ids.allow_user_policy
        else ""
    )
    # A Binding (pods/binding, or the legacy namespaced `bindings` resource) copies its annotations
    # onto the pod: only the extender's identity binds with ours.
    is_pod = "request.resource.resource == 'pods' && request.?subResource.orValue('') != 'binding'"
    return policy(
        ids,
        "pods",
        [rule(["pods", "pods/status", "pods/binding", "bindings"])],
        variables=[
            *_common_variables(ids),
            {"name": "changed", "expression": _changed(protected)},
            {"name": "changedAny", "expression": _changed("true")},
        ],
        validations=[
            {
                # Our annotations: the extender writes them; a node's plugin marks its pods served.
                "expression": (
                    "size(variables.changed) == 0 || variables.isAdmin || variables.isExtender || "
                    f"(variables.isPlugin && {is_pod} && variables.changed.all(k, k in {plugin_keys}))"
                    f"{setters}"
                ),
                "messageExpression": (
                    f"'{what} on pods are written only by the gpushare extender ({extenders}); "
                    f"the device plugin of the pod\\'s node ({plugins}) may set only "
                    f"{' and '.join(PLUGIN_POD_KEYS)}. ' + request.userInfo.username + "
                    "' may not set ' + variables.changed.join(', ') + "
                    "'; remove them from the pod (users may set gpushare-hub.io/card-models)'"
                ),
                "reason": "Forbidden",
            },
            {
                # The plugin is as narrow as a kubelet: pods bound to its own node, two annotations.
                "expression": (
                    f"!variables.isPlugin || ({is_pod} && variables.tokenNode != '' && "
                    "object.spec.?nodeName.orValue('') == variables.tokenNode && "
                    f"variables.changedAny.all(k, k in {plugin_keys}) && "
                    "(oldObject == null || object.metadata.?labels.orValue({}) == "
                    "oldObject.metadata.?labels.orValue({})))"
                ),
                "messageExpression": (
                    "'the gpushare device plugin may change only pods bound to its own node, and on them "
                    f"only {' and '.join(PLUGIN_POD_KEYS)}: ' + request.userInfo.username + "
                    "(variables.tokenNode == '' ? ' has no node name in its token (use a "
                    "service-account token bound to the plugin\\'s pod)' : ' runs on node ' + "
                    "variables.tokenNode) + ', the pod is on ' + "
                    "(has(object.spec) ? object.spec.?nodeName.orValue('no node') : 'no node')"
                ),
                "reason": "Forbidden",
            },
        ],
    )


def _node_policy(ids: Identities) -> dict[str, Any]:
    protected = " || ".join(f"k == {cel_str(k)}" for k in NODE_KEYS)
    plugins = ", ".join(ids.plugin)
    return policy(
        ids,
        "nodes",
        [rule(["nodes", "nodes/status"])],
        variables=[*_common_variables(ids), {"name": "changed", "expression": _changed(protected)}],
        validations=[
            {
                "expression": (
                    "size(variables.changed) == 0 || variables.isAdmin || "
                    "(variables.isPlugin && variables.tokenNode == object.metadata.name)"
                ),
                "messageExpression": (
                    f"'{' and '.join(NODE_KEYS)} on a Node are written only by the gpushare device "
                    f"plugin ({plugins}) of that node; ' + request.userInfo.username + ' may not set ' + "
                    "variables.changed.join(', ') + ' on node ' + object.metadata.name"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": "!variables.isPlugin || variables.tokenNode == object.metadata.name",
                "messageExpression": (
                    "'the gpushare device plugin may change only its own Node: ' + "
                    "request.userInfo.username + (variables.tokenNode == '' ? ' has no node name in its "
                    "token' : ' runs on node ' + variables.tokenNode) + ', not ' + object.metadata.name"
                ),
                "reason": "Forbidden",
            },
        ],
    )


def admission_manifests(ids: Identities | None = None) -> list[dict[str, Any]]:
    """The policies for pods, for nodes and for what pods ask of the NVIDIA runtime, each with its
    binding (cluster-wide)."""
    ids = ids or Identities()
    out: list[dict[str, Any]] = []
    for made in (_pod_policy(ids), _node_policy(ids), runtime_policy(ids)):
        out += [made, binding(made)]
    return out


def admission_yaml(ids: Identities | None = None) -> str:
    """The manifests as one multi-document YAML file, as the chart installs it."""
    header = (
        "# Generated by `gpushare-extender --print-admission-policy` (gpushare_hub/extender/admission.py);"
        " do not edit.\n"
    )
    return header + yaml.safe_dump_all(admission_manifests(ids), sort_keys=False, width=1_000_000)
