"""What the report (:mod:`.report`) needs of Nodes and Pods beyond the ledger. Pure: no I/O.

A node's address and whether it offers GPU memory (:class:`NodeFacts`); per GPU pod its names,
the hub user and server KubeSpawner writes on it, its slice, since when it holds its card, and
the scheduler's reason while no node has taken it (:class:`PodFacts`, :class:`PendingPod`);
and :func:`may_hold_slice`, the test of a pod that may hold or wait for a slice.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from gpushare_hub.core.demand import Demand, demand_from_pod
from gpushare_hub.core.digits import ascii_int
from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.hibernated import NodeHibernation, read_node_hibernation
from gpushare_hub.core.ledger import TERMINAL_PHASES
from gpushare_hub.core.objects import NodeObject, PodObject
from gpushare_hub.core.resources import DEFAULT_NAMES, ResourceNames
from gpushare_hub.core.usage import NodeUsage, read_usage

from .names import (
    ALLOCATION_ANNOTATION,
    DRA_TEMPLATE_PREFIX,
    GPU_MEM_ASSUME_TIME,
    GPU_MEM_IDX,
    GPU_MEM_POD,
    HIBERNATION_ANNOTATION,
    HUB_SERVER_ANNOTATION,
    HUB_USER_ANNOTATION,
    SLICE_ANNOTATION,
    USAGE_ANNOTATION,
)
from .reportrows import PodRow


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the report needs of a Node beyond the ledger: its address, and whether it offers
    GPU memory (a node whose card inventory is unreadable is shown only then)."""

    name: str
    address: str = "unknown"
    offers_gpu_memory: bool = True
    usage: NodeUsage | None = None  # None: the node's plugin publishes no usage
    hibernation: NodeHibernation | None = None  # None: the node does not overcommit (or says so unreadably)


@dataclass(frozen=True, slots=True)
class PendingPod:
    """What the service's metrics need of a GPU pod that has no node yet: its demand, the node
    selector that limits where it may go, and kube-scheduler's message (None until it has said one)."""

    demand: Demand
    node_selector: Mapping[str, str]
    scheduler: str | None


@dataclass(frozen=True, slots=True)
class PodFacts:
    """What the report needs of a GPU pod beyond the ledger, kept by the hub service per pod.

    ``row``: its names, the hub user and server, slice, units and since (with the scheduler's
    reason while ``node`` is empty); None when its request cannot be read, and then
    ``warning`` says why. ``warning`` is also set when the ledger could not read the pod.
    ``pending``: set while the pod has no node.
    """

    key: str
    node: str = ""
    row: PodRow | None = None
    warning: str = ""
    pending: PendingPod | None = None


def _address(node: NodeObject) -> str:
    for addr in node.addresses:
        if addr.type == "InternalIP" and addr.address:
            return addr.address
    return "unknown"


def _offers_gpu_memory(node: NodeObject, names: ResourceNames) -> bool:
    raw = (node.allocatable or node.capacity).get(names.memory)
    return raw not in (None, "0", 0)


def node_facts(node: NodeObject, names: ResourceNames = DEFAULT_NAMES) -> NodeFacts:
    return NodeFacts(
        name=node.name,
        address=_address(node),
        offers_gpu_memory=_offers_gpu_memory(node, names),
        usage=read_usage(node.annotations.get(USAGE_ANNOTATION)),
        hibernation=read_node_hibernation(node.annotations.get(HIBERNATION_ANNOTATION)),
    )


def _since(pod: PodObject) -> str:
    """When the pod got its card: the extender's assume time, else its start or creation."""
    raw = pod.annotations.get(GPU_MEM_ASSUME_TIME)
    nanoseconds = ascii_int(raw, 20) if raw is not None else None  # 20 digits: before year 5139
    if nanoseconds is not None:
        when = datetime.fromtimestamp(nanoseconds / 1e9, tz=UTC)
        return when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return pod.start_time or pod.creation_timestamp


def _scheduled(pod: PodObject) -> str:
    """When the pod was bound: its PodScheduled=True condition's transition ("" without one)."""
    for cond in pod.conditions:
        if cond.type == "PodScheduled" and cond.status == "True":
            return cond.last_transition
    return ""


def unreadable_warning(key: str, err: Exception) -> str:
    """A warning for a pod that could not be read: our errors name the pod already."""
    return str(err) if isinstance(err, GPUShareError) else f"pod {key}: {err}"


def _scheduler_message(pod: PodObject) -> str | None:
    """The message of the pod's PodScheduled=False condition; None while it has none."""
    for cond in pod.conditions:
        if cond.type == "PodScheduled" and cond.status == "False":
            return cond.message or cond.reason
    return None


def _pending(pod: PodObject, demand: Demand, message: str | None) -> PendingPod:
    return PendingPod(demand=demand, node_selector=dict(pod.node_selector), scheduler=message or None)


def pod_facts(
    pod: PodObject,
    names: ResourceNames = DEFAULT_NAMES,
    hub_namespaces: Collection[str] | None = None,
) -> PodFacts | None:
    """The facts of an active pod that asks for a GPU, or is the hub's spawn on the DRA path (a
    claim from our template, in ``hub_namespaces``), or whose request cannot be read; None for
    any other pod. ``hub_namespaces``: as :func:`build_report`'s. A DRA pod's units are its
    claim's, which the ledger counts under the pod's key; until then its row says 0, and it is
    no :class:`PendingPod` (the default scheduler places it, not our extender)."""
    if pod.phase in TERMINAL_PHASES:
        return None
    key = pod.key
    try:
        demand = demand_from_pod(pod, names)
    except GPUShareError as err:
        return PodFacts(key=key, warning=unreadable_warning(key, err))
    if demand is not None and not demand.wants_gpu:
        demand = None
    namespace = pod.namespace or "default"
    if demand is None and not _hub_dra_spawn(pod, namespace, hub_namespaces):
        return None
    ann: Mapping[str, str] = pod.annotations
    if hub_namespaces is not None and namespace not in hub_namespaces:
        ann = {}
    node = pod.node_name
    message = None if node else _scheduler_message(pod)
    row = PodRow(
        namespace=namespace,
        name=pod.name,
        uid=pod.uid,
        units=demand.per_card * demand.count if demand is not None and demand.per_card is not None else 0,
        hub_user=ann.get(HUB_USER_ANNOTATION, ""),
        hub_server=ann.get(HUB_SERVER_ANNOTATION, ""),
        reason="" if node else "not scheduled yet" if message is None else message,
        slice=ann.get(SLICE_ANNOTATION, ""),
        since=_since(pod),
        created=pod.creation_timestamp,
        scheduled=_scheduled(pod),
    )
    pending = None if node or demand is None else _pending(pod, demand, message)
    return PodFacts(key=key, node=node, row=row, pending=pending)


def _hub_dra_spawn(pod: PodObject, namespace: str, hub_namespaces: Collection[str] | None) -> bool:
    """Whether a pod that asks no GPU resource is a spawn on the DRA path: its claim comes from
    one of our templates (:data:`~.names.DRA_TEMPLATE_PREFIX`), in the hub's namespaces (any,
    for ``None``). Anyone may name a claim like ours; only the hub's pods wait for a slice."""
    if hub_namespaces is not None and namespace not in hub_namespaces:
        return False
    return any(c.template_name.startswith(DRA_TEMPLATE_PREFIX) for c in pod.resource_claims)


def may_hold_slice(pod: PodObject, names: ResourceNames = DEFAULT_NAMES) -> bool:
    """Whether a pod can hold or wait for a slice: a container or init container names either
    GPU resource, the pod carries an allocation record (ours or Aliyun's; the ledger decides
    whether it counts), or it claims a slice on the DRA path (:attr:`PodObject.claims_dra_slice`).
    What the hub keeps of the cluster's pods; no quantity is parsed, so it costs little on
    every pod event."""
    ann = pod.annotations
    if ALLOCATION_ANNOTATION in ann or GPU_MEM_IDX in ann or GPU_MEM_POD in ann or pod.claims_dra_slice:
        return True
    for container in (*pod.init_containers, *pod.containers):
        for amounts in (container.limits, container.requests):
            if names.memory in amounts or names.count in amounts:
                return True
    return False
