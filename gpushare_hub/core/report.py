"""What `kubectl inspect gpushare` and the hub service's dashboard show. Pure: no I/O.

The numbers come from the shared ledger (:class:`~gpushare_hub.core.ledger.Ledger`), so the
table agrees with what the extender decides. Beside the ledger the report needs a few facts
the ledger does not keep: a node's address (:class:`NodeFacts`), and per GPU pod its names,
the hub user and server KubeSpawner writes on it, its slice and since when it holds its
card, and the scheduler's reason while no node has taken it (:class:`PodFacts`). From those
it shows GPU pods bound to a node without a card (Aliyun's ``PENDING`` column) and GPU pods
that no node has taken yet.

One report, two renderers: :func:`report_from_ledger` builds it from a ledger that is kept
current (the hub service's informer, with the facts its subscribers keep), and
:func:`build_report` from a list of Nodes and Pods read once (the CLI).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from gpushare_hub.core.demand import Demand, demand_from_pod
from gpushare_hub.core.digits import ascii_int
from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.hibernated import (
    CardHibernation,
    NodeHibernation,
    card_hibernation,
    read_node_hibernation,
)
from gpushare_hub.core.isolation import NodeIsolation
from gpushare_hub.core.ledger import TERMINAL_PHASES, Ledger
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


@dataclass(frozen=True)
class PodRow:
    namespace: str
    name: str
    units: int
    hub_user: str = ""
    hub_server: str = ""
    reason: str = ""
    slice: str = ""  # the hub's catalogue slug, when the spawner wrote one
    since: str = ""  # RFC 3339 UTC: when the card was assigned (else the pod started or was made)
    created: str = ""  # RFC 3339 UTC: when the pod was made
    scheduled: str = ""  # RFC 3339 UTC: when it was bound to its node ("" while unknown)
    used_mib: int | None = None  # GPU memory its processes hold on the card (None: not measured)
    sm_util: int | None = None  # percent of the card's SMs its processes keep busy (None: not measured)
    idle_since: int | None = None  # Unix seconds it has been idle on the GPU from (None: active, or unknown)
    over_slice: bool = False  # its processes hold more than its slice on the card
    uid: str = ""  # the pod's UID (what a node's hibernation book names it by)
    hibernated_since: int | None = None  # Unix seconds it is hibernated from (None: awake, or no overcommit)


@dataclass(frozen=True)
class CardRow:
    index: int
    uuid: str
    model: str
    units: int
    used: int
    healthy: bool
    pods: tuple[PodRow, ...] = ()
    hibernation: CardHibernation | None = None  # on a node that overcommits its cards


@dataclass(frozen=True)
class NodeRow:
    name: str
    address: str
    cards: tuple[CardRow, ...] = ()
    # GPU pods bound here that hold no card (Aliyun's PENDING column).
    unplaced: tuple[PodRow, ...] = ()
    # Set when the node advertises GPU memory but its card inventory cannot be read.
    problem: str = ""
    isolation: NodeIsolation = field(default_factory=NodeIsolation)
    usage_measured: bool = False  # the node's plugin publishes per-pod GPU memory in use

    @property
    def used(self) -> int:
        return sum(c.used for c in self.cards) + sum(p.units for p in self.unplaced)

    @property
    def total(self) -> int:
        return sum(c.units for c in self.cards)


@dataclass(frozen=True)
class Report:
    unit: str
    resource: str
    nodes: tuple[NodeRow, ...]
    pending: tuple[PodRow, ...] = ()  # GPU pods no node has taken yet
    warnings: tuple[str, ...] = field(default=())

    @property
    def used(self) -> int:
        return sum(n.used for n in self.nodes)

    @property
    def total(self) -> int:
        return sum(n.total for n in self.nodes)

    def to_json(self) -> dict[str, Any]:
        def pod(p: PodRow) -> dict[str, Any]:
            out: dict[str, Any] = {"namespace": p.namespace, "name": p.name, "units": p.units}
            if p.hub_user:
                out["hub_user"] = p.hub_user
                out["hub_server"] = p.hub_server
            if p.reason:
                out["reason"] = p.reason
            if p.used_mib is not None:  # the node's plugin measures usage
                out["used_mib"] = p.used_mib
                out["over_slice"] = p.over_slice
                out["sm_util"] = p.sm_util
                out["idle_since"] = p.idle_since
            return out

        return {
            "unit": self.unit,
            "resource": self.resource,
            "used": self.used,
            "total": self.total,
            "nodes": [
                {
                    "name": n.name,
                    "address": n.address,
                    "used": n.used,
                    "total": n.total,
                    **({"problem": n.problem} if n.problem else {}),
                    "cards": [
                        {
                            "index": c.index,
                            "uuid": c.uuid,
                            "model": c.model,
                            "units": c.units,
                            "used": c.used,
                            "free": max(c.units - c.used, 0),
                            "healthy": c.healthy,
                            "pods": [pod(p) for p in c.pods],
                        }
                        for c in n.cards
                    ],
                    "unplaced": [pod(p) for p in n.unplaced],
                }
                for n in self.nodes
            ],
            "pending": [pod(p) for p in self.pending],
            "warnings": list(self.warnings),
        }


# ---- what the report needs beyond the ledger ---------------------------------------------------


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


def _unreadable(key: str, err: Exception) -> str:
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
        return PodFacts(key=key, warning=_unreadable(key, err))
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


# ---- the report: from a ledger and those facts ---------------------------------------------------


def report_from_ledger(ledger: Ledger, nodes: Iterable[NodeFacts], pods: Iterable[PodFacts]) -> Report:
    """The report of ``ledger``'s nodes (and of the GPU nodes whose inventory it cannot read),
    with the names and reasons of ``pods``: the hub service calls it with its informer's
    ledger, :func:`build_report` with one read from a list."""
    shown = _shown_nodes(ledger, nodes)
    pods = list(pods)
    rows = {p.key: p.row for p in pods if p.row is not None}
    holders = _holders(ledger, rows)
    unplaced, pending = _waiting(ledger, pods, shown)
    return Report(
        unit=ledger.names.unit,
        resource=ledger.names.memory,
        nodes=tuple(
            _node_row(ledger, facts, holders, unplaced.get(name, [])) for name, facts in shown.items()
        ),
        pending=_sorted(pending),
        warnings=tuple(_warnings(ledger, pods)),
    )


def _shown_nodes(ledger: Ledger, nodes: Iterable[NodeFacts]) -> dict[str, NodeFacts]:
    """By name, sorted: the ledger's nodes, and the GPU nodes whose inventory is unreadable."""
    known = {n.name: n for n in nodes}
    for name in ledger.node_names:
        known.setdefault(name, NodeFacts(name))
    return {
        name: facts
        for name, facts in sorted(known.items())
        if ledger.node(name) is not None or (facts.offers_gpu_memory and ledger.unreadable(name) is not None)
    }


def _holders(ledger: Ledger, rows: Mapping[str, PodRow]) -> dict[tuple[str, str], list[PodRow]]:
    """(node, card UUID) -> the pods holding units of that card, each with its share."""
    holders: dict[tuple[str, str], list[PodRow]] = {}
    for alloc in ledger.allocations():
        namespace, _, name = alloc.key.partition("/")
        base = rows.get(alloc.key) or PodRow(namespace=namespace, name=name, units=0, uid=alloc.uid)
        for share in alloc.cards:
            holders.setdefault((alloc.node, share.uuid), []).append(replace(base, units=share.units))
    return holders


def _waiting(
    ledger: Ledger, pods: Iterable[PodFacts], shown: Mapping[str, NodeFacts]
) -> tuple[dict[str, list[PodRow]], list[PodRow]]:
    """GPU pods bound to a shown node without a card (by node), and those on no node yet."""
    unplaced: dict[str, list[PodRow]] = {}
    pending: list[PodRow] = []
    for pod in pods:
        if pod.row is None:
            continue
        if not pod.node:
            pending.append(pod.row)
        elif ledger.allocation(pod.key) is None and pod.node in shown:
            unplaced.setdefault(pod.node, []).append(pod.row)
    return unplaced, pending


def _node_row(
    ledger: Ledger,
    facts: NodeFacts,
    holders: Mapping[tuple[str, str], list[PodRow]],
    unplaced: list[PodRow],
) -> NodeRow:
    node = ledger.node(facts.name)
    problem = ledger.unreadable(facts.name)
    cards = sorted(node.cards, key=lambda c: c.index) if node is not None else []
    mib = ledger.names.mib_per_unit
    rows = []
    for card in cards:
        pods = _with_usage(holders.get((facts.name, card.uuid), []), card.uuid, facts.usage, mib)
        pods = _with_hibernation(pods, card.uuid, facts.hibernation)
        used = ledger.used(facts.name, card.uuid)
        asleep = sum(p.units for p in pods if p.hibernated_since is not None)
        rows.append(
            CardRow(
                index=card.index,
                uuid=card.uuid,
                model=card.model,
                units=card.units,
                used=used,
                healthy=card.healthy,
                pods=_sorted(pods),
                hibernation=card_hibernation(facts.hibernation, card.uuid, used * mib, asleep * mib, mib),
            )
        )
    return NodeRow(
        name=facts.name,
        address=facts.address,
        cards=tuple(rows),
        unplaced=_sorted(unplaced),
        problem=f"card inventory unreadable: {problem}" if problem is not None else "",
        isolation=node.isolation if node is not None else NodeIsolation(),
        usage_measured=facts.usage is not None,
    )


def _with_usage(
    rows: Iterable[PodRow], card: str, usage: NodeUsage | None, mib_per_unit: int
) -> list[PodRow]:
    if usage is None:
        return list(rows)
    out = []
    for p in rows:
        use = usage.of_pod(f"{p.namespace}/{p.name}", card)
        out.append(
            replace(
                p,
                used_mib=use.used_mib,
                sm_util=use.sm_util,
                idle_since=use.idle_since,
                over_slice=use.used_mib > p.units * mib_per_unit,
            )
        )
    return out


def _with_hibernation(rows: list[PodRow], card: str, hib: NodeHibernation | None) -> list[PodRow]:
    if hib is None:
        return rows
    return [replace(p, hibernated_since=hib.hibernated_since(p.uid, card)) for p in rows]


def _sorted(rows: Iterable[PodRow]) -> tuple[PodRow, ...]:
    return tuple(sorted(rows, key=lambda p: (p.namespace, p.name)))


def _warnings(ledger: Ledger, pods: Iterable[PodFacts]) -> Iterator[str]:
    """Per GPU pod, in order: why it could not be read, or why its allocation record is ignored."""
    ignored = {rec.key: rec for rec in ledger.ignored()}
    for pod in pods:
        if pod.warning:
            yield pod.warning
        elif pod.key in ignored:
            yield ignored[pod.key].message()


# ---- the report: from Node and Pod objects -------------------------------------------------------


def build_report(
    nodes: Iterable[NodeObject],
    pods: Iterable[PodObject],
    names: ResourceNames = DEFAULT_NAMES,
    only_node: str | None = None,
    hub_namespaces: Collection[str] | None = None,
) -> Report:
    """The report for every GPU-sharing node (or ``only_node``) and the active GPU pods, read
    from Node and Pod objects into a ledger of its own (``kubectl inspect gpushare``).

    ``hub_namespaces``: where the hub's spawner creates its pods. The hub user and server
    annotations are believed only on pods there (anyone who may create a pod elsewhere could
    write another user's name on it); None believes them everywhere (the CLI, run by admins).
    """
    ledger = Ledger(names)
    read_nodes = [_observe_node(ledger, obj, names) for obj in nodes if _named(obj, only_node)]
    read_pods = []
    for obj in pods:
        facts = pod_facts(obj, names, hub_namespaces)
        if facts is None or (facts.row is not None and only_node and facts.node != only_node):
            continue
        read_pods.append(facts if facts.row is None else _observe_pod(ledger, obj, facts))
    return report_from_ledger(ledger, read_nodes, read_pods)


def _named(node: NodeObject, only_node: str | None) -> bool:
    return not only_node or node.name == only_node


def _observe_node(ledger: Ledger, obj: NodeObject, names: ResourceNames) -> NodeFacts:
    facts = node_facts(obj, names)
    try:
        ledger.observe_node(obj)
    except GPUShareError as err:  # says why: the node is shown, out of placement
        ledger.mark_unreadable(facts.name, str(err))
    return facts


def _observe_pod(ledger: Ledger, obj: PodObject, facts: PodFacts) -> PodFacts:
    try:
        ledger.observe_pod(obj)
    except GPUShareError as err:  # says why
        return replace(facts, warning=_unreadable(facts.key, err))
    return facts
