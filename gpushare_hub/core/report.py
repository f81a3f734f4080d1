"""What `kubectl inspect gpushare` and the hub service's dashboard show. Pure: no I/O.

The numbers come from the shared ledger (:class:`~gpushare_hub.core.ledger.Ledger`), so the
table agrees with what the extender decides. Beside the ledger the report needs a few facts
the ledger does not keep (:mod:`.reportfacts`): a node's address, and per GPU pod its names,
the hub user and server KubeSpawner writes on it, its slice and since when it holds its
card, and the scheduler's reason while no node has taken it. From those it shows GPU pods
bound to a node without a card (Aliyun's ``PENDING`` column) and GPU pods that no node has
taken yet. Its rows are in :mod:`.reportrows`.

One report, two renderers: :func:`report_from_ledger` builds it from a ledger that is kept
current (the hub service's informer, with the facts its subscribers keep), and
:func:`build_report` from a list of Nodes and Pods read once (the CLI).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import replace

from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.hibernated import NodeHibernation, card_hibernation
from gpushare_hub.core.isolation import NodeIsolation
from gpushare_hub.core.ledger import Ledger
from gpushare_hub.core.objects import NodeObject, PodObject
from gpushare_hub.core.resources import DEFAULT_NAMES, ResourceNames
from gpushare_hub.core.usage import NodeUsage

from .reportfacts import NodeFacts, PodFacts, node_facts, pod_facts, unreadable_warning
from .reportrows import CardRow, NodeRow, PodRow, Report

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
        return replace(facts, warning=unreadable_warning(facts.key, err))
    return facts
