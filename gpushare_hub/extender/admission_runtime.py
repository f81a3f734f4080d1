"""The admission policy that keeps a pod from choosing a card at the container runtime.

The NVIDIA container runtime (the ``nvidia`` RuntimeClasses of the GPU Operator, or ``nvidia`` as
containerd's default runtime in the toolkit's legacy mode) gives a container the cards that
``NVIDIA_VISIBLE_DEVICES`` names, and applies the memory limits of ``NVIDIA_GPU_MEMORY_*``; MPS
clients follow ``CUDA_MPS_*`` (the pipe, the pinned memory limit, the thread share). The device
plugin sets them for the card it handed out; a user who sets them on a pod, or who runs a pod in
such a RuntimeClass (whose image may set ``NVIDIA_VISIBLE_DEVICES=all``, as NVIDIA's CUDA images
do), gets cards no ledger counts. So, for every pod outside ``exempt_namespaces`` (ours, the
cluster's and the GPU Operator's, whose pods need them) and not created by an admin or a node:

* no container, init container or ephemeral container sets one of those variables by name
  (``env``; ``envFrom`` cannot be read at admission: the toolkit's
  ``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` closes it, docs/security.md);
* ``spec.runtimeClassName`` is none of ``runtime_classes``.

It matches pod creation and the ``ephemeralcontainers`` subresource (a container added to a running
pod); a pod's containers and runtime class cannot change otherwise.
"""

from __future__ import annotations

from typing import Any

from .admission_base import Identities, admin_variable, cel_list, cel_str, policy, rule

ENV_NAMES = ("NVIDIA_VISIBLE_DEVICES",)
ENV_PREFIXES = ("NVIDIA_GPU_MEMORY_", "CUDA_MPS_")


def _bad(var: str) -> str:
    """CEL: the variable name ``var`` is one of the runtime's."""
    names = [f"{var} == {cel_str(n)}" for n in ENV_NAMES]
    prefixes = [f"{var}.startsWith({cel_str(p)})" for p in ENV_PREFIXES]
    return "(" + " || ".join(names + prefixes) + ")"


def _offenders(containers: str, kind: str) -> str:
    """CEL: '<kind> <name> sets <variables>' for each of ``containers`` that sets one."""
    return (
        f"{containers}.filter(c, c.?env.orValue([]).exists(e, {_bad('e.name')}))"
        f".map(c, '{kind} ' + c.name + ' sets ' + "
        f"c.env.filter(e, {_bad('e.name')}).map(e, e.name).join(', '))"
    )


def runtime_policy(ids: Identities) -> dict[str, Any]:
    what = ", ".join([*ENV_NAMES, *(p + "*" for p in ENV_PREFIXES)])
    new_ephemeral = (
        "(oldObject == null ? object.spec.?ephemeralContainers.orValue([]) : "
        "object.spec.?ephemeralContainers.orValue([]).filter(c, "
        "!oldObject.spec.?ephemeralContainers.orValue([]).exists(o, o.name == c.name)))"
    )
    on_create = "(oldObject == null ? object.spec.{0} : [])"
    return policy(
        ids,
        "pod-runtime",
        [rule(["pods"], ("CREATE",)), rule(["pods/ephemeralcontainers"], ("UPDATE",))],
        variables=[
            admin_variable(ids),
            {"name": "exemptNamespaces", "expression": cel_list(ids.exempt_namespaces)},
            {"name": "runtimeClasses", "expression": cel_list(ids.runtime_classes)},
            {
                "name": "exempt",
                "expression": (
                    "variables.isAdmin || request.namespace in variables.exemptNamespaces || "
                    "request.userInfo.username.startsWith('system:node:')"
                ),
            },
            {
                "name": "pod",
                "expression": (
                    "request.namespace + '/' + "
                    "object.metadata.?name.orValue(object.metadata.?generateName.orValue(''))"
                ),
            },
            {
                "name": "badEnv",
                "expression": (
                    _offenders(on_create.format("containers"), "container")
                    + " + "
                    + _offenders(on_create.format("?initContainers.orValue([])"), "init container")
                    + " + "
                    + _offenders(new_ephemeral, "ephemeral container")
                ),
            },
        ],
        validations=[
            {
                "expression": "variables.exempt || size(variables.badEnv) == 0",
                "messageExpression": (
                    "'pod ' + variables.pod + ': ' + variables.badEnv.join('; ') + "
                    f"': {what} choose a GPU, or its memory or MPS limits, at the container runtime, and "
                    "only the gpushare device plugin sets them. Remove them and ask for a GPU slice "
                    "instead (the gpushare resource in resources.limits, or a claim from a gpushare-slice "
                    "template); only pods in the namespaces ' + variables.exemptNamespaces.join(', ') + "
                    "' may set them'"
                ),
                "reason": "Forbidden",
            },
            {
                "expression": (
                    "variables.exempt || oldObject != null || "
                    "!(object.spec.?runtimeClassName.orValue('') in variables.runtimeClasses)"
                ),
                "messageExpression": (
                    "'pod ' + variables.pod + ': runtimeClassName ' + object.spec.runtimeClassName + "
                    "' hands a container every GPU that its environment or its image names "
                    "(NVIDIA_VISIBLE_DEVICES), whatever it asked for. Remove runtimeClassName and ask "
                    "for a GPU slice instead: the device plugin hands the card over without it; only "
                    "pods in the namespaces ' + variables.exemptNamespaces.join(', ') + ' may use ' + "
                    "variables.runtimeClasses.join(', ')"
                ),
                "reason": "Forbidden",
            },
        ],
    )
