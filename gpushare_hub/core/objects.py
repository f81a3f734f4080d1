"""Pods and Nodes as the core reads them: typed values, built only by the readers of
:mod:`.shapes` (:func:`~.shapes.read_pod`, :func:`~.shapes.read_node`). Pure.

Each holds exactly the fields some part of the core reads, already checked; nothing downstream
of a reader looks at a raw API object or checks a type again. Absent fields are empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .names import DRA_POD_CLAIM, DRA_TEMPLATE_PREFIX

Quantity = str | int | float  # a resource amount as the API sends it ("5", 5, "500m")


def _empty() -> Mapping[str, str]:
    return {}


@dataclass(frozen=True)
class Container:
    """One container (or init container) of a pod."""

    name: str = "?"
    restart_policy: str = ""  # "Always" marks a restartable init container (a sidecar)
    limits: Mapping[str, Quantity] = field(default_factory=dict)
    requests: Mapping[str, Quantity] = field(default_factory=dict)
    run_as_user: int | None = None  # its securityContext.runAsUser


@dataclass(frozen=True)
class Condition:
    type: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    last_transition: str = ""  # RFC 3339: when it took its status (PodScheduled True: the bind)


@dataclass(frozen=True)
class PodClaim:
    """One ``spec.resourceClaims[]`` entry: the pod's name for a ResourceClaim, and where the
    claim comes from (an existing claim's name, or the template a claim is made from)."""

    name: str = ""
    claim_name: str = ""  # resourceClaimName
    template_name: str = ""  # resourceClaimTemplateName


@dataclass(frozen=True)
class Taint:
    """One ``spec.taints[]`` entry of a Node."""

    key: str = ""
    value: str = ""
    effect: str = ""  # NoSchedule, PreferNoSchedule, NoExecute


@dataclass(frozen=True)
class Toleration:
    """One ``spec.tolerations[]`` entry of a Pod."""

    key: str = ""
    operator: str = ""  # "Exists", or "Equal" (also when empty)
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' rule (k8s.io/api/core/v1 Toleration.ToleratesTaint)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


def tolerates_all(tolerations: tuple[Toleration, ...], taints: tuple[Taint, ...]) -> bool:
    """Whether a pod with ``tolerations`` may be scheduled onto a node with ``taints`` (the taints
    that keep pods off, NoSchedule and NoExecute, each tolerated)."""
    return all(
        any(t.tolerates(taint) for t in tolerations)
        for taint in taints
        if taint.effect in ("NoSchedule", "NoExecute")
    )


@dataclass(frozen=True)
class PodObject:
    """A Pod: its identity, annotations, where it runs or may run, what its containers ask."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=_empty)
    annotations: Mapping[str, str] = field(default_factory=_empty)
    creation_timestamp: str = ""
    deletion_timestamp: str = ""
    node_name: str = ""  # spec.nodeName: "" until bound
    scheduler_name: str = ""
    node_selector: Mapping[str, str] = field(default_factory=_empty)
    init_containers: tuple[Container, ...] = ()
    containers: tuple[Container, ...] = ()
    run_as_user: int | None = None  # the pod's securityContext.runAsUser
    phase: str = ""
    start_time: str = ""
    conditions: tuple[Condition, ...] = ()
    resource_claims: tuple[PodClaim, ...] = ()  # spec.resourceClaims (the DRA path)
    tolerations: tuple[Toleration, ...] = ()

    @property
    def key(self) -> str:
        """``namespace/name``, the name the core keeps the pod under."""
        return f"{self.namespace or 'default'}/{self.name or '?'}"

    @property
    def claims_dra_slice(self) -> bool:
        """Whether the pod claims a slice on our DRA path: a pod claim named
        :data:`~.names.DRA_POD_CLAIM`, or one made from a template of ours
        (:data:`~.names.DRA_TEMPLATE_PREFIX`). It asks no GPU-memory resource; the default
        scheduler allocates its claim, which the ledger counts under the pod's key."""
        return any(
            c.name == DRA_POD_CLAIM or c.template_name.startswith(DRA_TEMPLATE_PREFIX)
            for c in self.resource_claims
        )


@dataclass(frozen=True)
class Address:
    type: str = ""
    address: str = ""


@dataclass(frozen=True)
class NodeObject:
    """A Node: its name, labels and annotations (our card inventory, tier, usage), resources."""

    name: str
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=_empty)
    annotations: Mapping[str, str] = field(default_factory=_empty)
    capacity: Mapping[str, Quantity] = field(default_factory=dict)
    allocatable: Mapping[str, Quantity] = field(default_factory=dict)
    addresses: tuple[Address, ...] = ()
    taints: tuple[Taint, ...] = ()


def pod_key(obj: Mapping[str, Any]) -> str:
    """The key of a raw Pod object (or of the name-only objects of delete events), for adapters
    that index API objects before reading them; the same as :attr:`PodObject.key`."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"
