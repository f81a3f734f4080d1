"""Placement: which node and which card(s) a demand goes to, or why it cannot go anywhere.

A :class:`Policy` ranks the feasible (node, cards) candidates; lower keys win and
ties fall to the node name and card index, so every decision is deterministic.

* ``binpack`` (default): the fullest card that fits (best fit), then the fullest node.
* ``spread``: the emptiest card, then the emptiest node (worst fit); each user
  gets the most headroom, at the price of more cards in use.
* ``fgd``: fragmentation gradient descent (Weng et al., ATC'23): the candidate that
  least increases the GPU capacity the expected workload could not use; node
  level, aware of CPU and host memory where the node tracks them.

Refusals distinguish *not now* (some card could hold it once others leave) from
*never* (larger than any card the pod may use), and name the way out.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from .annotations import CardShare, ContainerShare
from .cards import Card, Node
from .demand import Demand
from .handout import Handout, first_conflict, handouts, waiting_by_size
from .ledger import Ledger, Placement, _NodeState
from .resources import ResourceNames


@dataclass(slots=True)
class NodeView:
    """What a policy sees of one node: each allowed card with its free units."""

    name: str
    cards: tuple[tuple[Card, int], ...]
    units: int
    free_units: int
    cpu_free: int | None = None
    memory_free: int | None = None
    cpu_total: int | None = None
    all_cards: tuple[tuple[Card, int], ...] = ()


@dataclass(frozen=True)
class Refusal:
    """Why a demand was not placed. ``permanent``: it never fits as asked."""

    key: str
    reason: str
    permanent: bool
    nodes: Mapping[str, str] = field(default_factory=dict)
    unresolvable: Mapping[str, str] = field(default_factory=dict)


class Policy:
    """Ranks candidates. Subclasses override :meth:`card_key` and :meth:`node_key`."""

    name: ClassVar[str] = ""

    def card_key(self, view: NodeView, card: Card, free: int, take: int) -> tuple[float, ...]:
        raise NotImplementedError

    def node_key(
        self, view: NodeView, chosen: tuple[tuple[Card, int], ...], demand: Demand, take: int
    ) -> tuple[float, ...]:
        raise NotImplementedError

    def observe(self, demand: Demand, placed: bool) -> None:
        """Hook for policies that learn the workload's shape from arriving demands."""


class Binpack(Policy):
    """Best fit: the card left with the least free memory, then the node left fullest
    (then, where the node tracks CPU, the node left with the least CPU)."""

    name = "binpack"

    def card_key(self, view: NodeView, card: Card, free: int, take: int) -> tuple[float, ...]:
        return (free - take, card.index)

    def node_key(
        self, view: NodeView, chosen: tuple[tuple[Card, int], ...], demand: Demand, take: int
    ) -> tuple[float, ...]:
        left = sum(free - take for _, free in chosen)
        host = 0.0
        if view.cpu_free is not None and view.cpu_total:
            host = (view.cpu_free - demand.cpu_milli) / view.cpu_total
        return (left, view.free_units - take * len(chosen), host)


class Spread(Policy):
    """Worst fit: the emptiest card, then the emptiest node."""

    name = "spread"

    def card_key(self, view: NodeView, card: Card, free: int, take: int) -> tuple[float, ...]:
        return (-(free - take), card.index)

    def node_key(
        self, view: NodeView, chosen: tuple[tuple[Card, int], ...], demand: Demand, take: int
    ) -> tuple[float, ...]:
        left = sum(free - take for _, free in chosen)
        return (-left, -(view.free_units - take * len(chosen)))


PolicyFactory = Callable[[], Policy]
POLICIES: dict[str, PolicyFactory] = {"binpack": Binpack, "spread": Spread}


def register_policy(name: str, factory: PolicyFactory) -> None:
    POLICIES[name] = factory


def make_policy(name: str) -> Policy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}") from None


FEASIBLE, NOT_NOW, NEVER = 0, 1, 2
# A node's evaluation for one demand shape:
#   (FEASIBLE, key, chosen cards) | (NOT_NOW, reason, largest free block, its card index[, TRANSIENT])
#   | (NEVER, reason)
# TRANSIENT marks a hold that lifts by itself within seconds (see _pending_cards).
TRANSIENT = "transient"
_Eval = tuple[object, ...]
# Distinct demand shapes cached (per node, and heaps over all nodes). Real pods come in a few
# shapes (the catalogue's slices); past this many the cache starts again rather than grow.
MAX_SHAPES = 1024


class _ShapeIndex:
    """Feasible nodes for one demand shape, in a heap ordered by the policy's key.

    Entries of nodes that changed since are stale; they are skipped when popped,
    and changed nodes are re-evaluated from the ledger's change log.
    """

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[tuple[float, ...], str, int]] = []
        self.seq = -1


class Placer:
    """Places demands on a ledger with a policy. Caches per-node evaluations.

    A node's evaluation for a given demand shape only changes when the node
    changes, so it is cached under the node's version; a per-shape heap of
    feasible nodes lets :meth:`decide` over the whole cluster touch only the
    nodes that changed since that shape was last placed. This is what keeps a
    1,000-node replay fast. The placer writes the ledger only in
    :meth:`place_and_commit`.
    """

    def __init__(self, ledger: Ledger, policy: Policy | str = "binpack") -> None:
        self.ledger = ledger
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self._cache: dict[str, tuple[int, dict[tuple[object, ...], _Eval]]] = {}
        self._index: dict[tuple[object, ...], _ShapeIndex] = {}

    @property
    def names(self) -> ResourceNames:
        return self.ledger.names

    @staticmethod
    def shape(demand: Demand) -> tuple[object, ...]:
        """What a node's answer for ``demand`` depends on (besides the node itself)."""
        return (
            demand.per_card,
            demand.count,
            demand.models,
            demand.exclude_models,
            demand.cpu_milli,
            demand.memory_mib,
            bool(demand.count_containers),
        )

    # ---- one node -----------------------------------------------------------------
    def _view(self, st: _NodeState, demand: Demand) -> NodeView:
        used = st.used
        every = tuple((c, max(0, c.units - used.get(c.uuid, 0))) for c in st.node.cards)
        if demand.models or demand.exclude_models:
            allowed = tuple((c, f) for c, f in every if c.healthy and demand.model_allowed(c.model))
        else:
            allowed = tuple((c, f) for c, f in every if c.healthy)
        cpu = None if st.node.cpu_milli is None else st.node.cpu_milli - st.cpu_used
        mem = None if st.node.memory_mib is None else st.node.memory_mib - st.memory_used
        return NodeView(
            name=st.node.name,
            cards=allowed,
            units=st.node.units,
            free_units=sum(f for _, f in every),
            cpu_free=cpu,
            memory_free=mem,
            cpu_total=st.node.cpu_milli,
            all_cards=every,
        )

    def _evaluate(self, st: _NodeState, demand: Demand) -> _Eval:
        names = self.names
        node = st.node
        view = self._view(st, demand)
        if view.cards:
            best_card, best_free = max(view.cards, key=lambda cf: (cf[1], -cf[0].index))
            best = (best_free, best_card.index)
        else:
            best = (0, -1)
        if view.cpu_free is not None and demand.cpu_milli > view.cpu_free:
            if node.cpu_milli is not None and demand.cpu_milli > node.cpu_milli:
                return (
                    NEVER,
                    f"node {node.name} has {node.cpu_milli}m CPU, the pod asks {demand.cpu_milli}m",
                )
            return (
                NOT_NOW,
                f"node {node.name} has {view.cpu_free}m CPU free, the pod asks {demand.cpu_milli}m",
                *best,
            )
        if view.memory_free is not None and demand.memory_mib > view.memory_free:
            if node.memory_mib is not None and demand.memory_mib > node.memory_mib:
                return (
                    NEVER,
                    f"node {node.name} has {node.memory_mib} MiB memory, the pod asks "
                    f"{demand.memory_mib} MiB",
                )
            return (
                NOT_NOW,
                f"node {node.name} has {view.memory_free} MiB memory free, the pod asks "
                f"{demand.memory_mib} MiB",
                *best,
            )
        if not demand.wants_gpu:
            return (FEASIBLE, self.policy.node_key(view, (), demand, 0), ())
        usable = [c for c, _ in view.cards]
        if not usable:
            models = sorted({c.model for c in node.cards})
            if demand.models or demand.exclude_models:
                return (
                    NEVER,
                    f"node {node.name} has no card of an allowed model (it has {', '.join(models)})",
                )
            return (NOT_NOW, f"node {node.name}: every card is unhealthy", *best)
        count = demand.count
        if demand.count_containers and node.allocator:
            # Whole-card handouts (gpu-count Allocate) follow the rule of handout.py too, in its
            # strictest form: one pod asking gpu-count at a time per node until the plugin served it.
            other = sorted(
                a.key for a in st.pods.values() if a.asks_count and not a.assigned and a.key != demand.key
            )
            if other:
                return (
                    NOT_NOW,
                    # Another user's pod is not named: this text reaches the waiting pod's owner
                    # (its PodScheduled condition, events and the spawn progress page).
                    f"node {node.name} is still handing whole cards (aliyun.com/gpu-count) to another "
                    "pod; a second such pod now would be ambiguous for the device plugin, so "
                    "this pod waits until that allocation is done",
                    *best,
                    TRANSIENT,
                )
        if len(usable) < count:
            return (
                NEVER,
                f"node {node.name} has {len(usable)} usable {demand.model_phrase()}card(s), "
                f"the pod asks {count}",
            )
        if demand.per_card is None:
            fitting = [(c, f) for c, f in view.cards if f == c.units]
            if len(fitting) < count:
                return (
                    NOT_NOW,
                    f"node {node.name} has {len(fitting)} empty {demand.model_phrase()}card(s), "
                    f"the pod asks {count} whole card(s)",
                    *best,
                )
        else:
            largest = max(c.units for c in usable)
            if demand.per_card > largest:
                return (
                    NEVER,
                    f"{demand.model_phrase()}cards on node {node.name} hold at most "
                    f"{names.fmt(largest)}, the pod asks {names.fmt(demand.per_card)} on one card",
                )
            fitting = [(c, f) for c, f in view.cards if f >= demand.per_card]
            if node.allocator:
                waiting = self._waiting(st)
                if waiting:
                    held = self._held_back(node, demand, fitting, waiting)
                    if isinstance(held, str):
                        return (NOT_NOW, held, *best, TRANSIENT)
                    fitting = held
            if len(fitting) < count:
                sick = [str(c.index) for c in node.cards if not c.healthy]
                why = f"; card {', '.join(sick)} is unhealthy and not used" if sick else ""
                if count == 1:
                    return (
                        NOT_NOW,
                        f"no {demand.model_phrase()}card on node {node.name} has "
                        f"{names.fmt(demand.per_card)} free; the largest free block is "
                        f"{names.fmt(best[0])} (card {best[1]}){why}",
                        *best,
                    )
                return (
                    NOT_NOW,
                    f"node {node.name} has {len(fitting)} {demand.model_phrase()}card(s) "
                    f"with {names.fmt(demand.per_card)} free, the pod asks {count}{why}",
                    *best,
                )
        pol = self.policy
        take = demand.per_card
        ranked = sorted(
            fitting,
            key=lambda cf: pol.card_key(view, cf[0], cf[1], cf[0].units if take is None else take),
        )
        chosen = tuple(ranked[:count])
        return (
            FEASIBLE,
            pol.node_key(view, chosen, demand, chosen[0][0].units if take is None else take),
            chosen,
        )

    @staticmethod
    def _waiting(st: _NodeState) -> dict[int, set[tuple[str, ...]]]:
        """Unserved handouts on the node, by size (see :mod:`~gpushare_hub.core.handout`)."""
        return waiting_by_size(handouts(a.containers) for a in st.pods.values() if not a.assigned)

    def _held_back(
        self,
        node: Node,
        demand: Demand,
        fitting: list[tuple[Card, int]],
        waiting: dict[int, set[tuple[str, ...]]],
    ) -> list[tuple[Card, int]] | str:
        """The fitting cards on which the pod's handouts keep the rule of
        :mod:`~gpushare_hub.core.handout`, or why the pod waits.

        The device plugin's Allocate learns only how many units a container gets,
        not which pod it is for. Keeping every unserved handout of one size on one
        card makes its answer right whichever of those containers it is serving;
        the plugin then marks the pod assigned and the next may go elsewhere.
        """
        sizes = [units for _, units in demand.containers] or [demand.per_card or 0]
        index = {c.uuid: c.index for c in node.cards}
        conflict: tuple[Handout, tuple[str, ...]] | None = None
        if demand.count == 1:
            kept = []
            for c, f in fitting:
                clash = first_conflict((Handout("", n, (c.uuid,)) for n in sizes), waiting)
                if clash is None:
                    kept.append((c, f))
                else:
                    conflict = conflict or clash
            if kept or conflict is None:
                return kept
        else:  # several cards: wait until no handout of these sizes is pending here
            for n in sizes:
                if n in waiting:
                    conflict = (Handout("", n, ()), sorted(waiting[n])[0])
                    break
            if conflict is None:
                return fitting
        held, cards = conflict
        where = ", ".join(f"card {index.get(u, '?')}" for u in cards)
        return (
            f"node {node.name} is still handing a {self.names.fmt(held.size)} slice of {where} to "
            "another pod; a second one on another card now would be ambiguous for the device "
            "plugin, so this pod waits until that allocation is done"
        )

    def _eval_node(self, name: str, st: _NodeState, shape: tuple[object, ...], demand: Demand) -> _Eval:
        entry = self._cache.get(name)
        if entry is None or entry[0] != st.version:
            entry = (st.version, {})
            self._cache[name] = entry
        hit = entry[1].get(shape)
        if hit is None:
            if len(entry[1]) >= MAX_SHAPES:  # pods' owners choose shapes: bound what they cost
                entry[1].clear()
            hit = entry[1][shape] = self._evaluate(st, demand)
        return hit

    # ---- many nodes ---------------------------------------------------------------
    def candidates(
        self, demand: Demand, nodes: Iterable[str] | None = None
    ) -> tuple[dict[str, _Eval], dict[str, _Eval], dict[str, str]]:
        """Evaluate ``nodes`` (default: all). Returns (feasible, not_now, never) by node name."""
        feasible: dict[str, _Eval] = {}
        not_now: dict[str, _Eval] = {}
        never: dict[str, str] = {}
        states = self.ledger._nodes
        shape = self.shape(demand)
        for name in states.keys() if nodes is None else nodes:
            st = states.get(name)
            if st is None:
                why = self.ledger.unreadable(name)
                never[name] = (
                    f"node {name} offers no {self.names.memory} (no GPU-sharing cards known)"
                    if why is None
                    else f"node {name}: its card inventory is unreadable, so nothing is placed there ({why})"
                )
                continue
            ev = self._eval_node(name, st, shape, demand)
            kind = ev[0]
            if kind == FEASIBLE:
                feasible[name] = ev
            elif kind == NOT_NOW:
                not_now[name] = ev
            else:
                never[name] = str(ev[1])
        return feasible, not_now, never

    def _best_anywhere(self, demand: Demand) -> tuple[str, _Eval] | None:
        """The policy's favourite node in the whole ledger, via the shape's heap."""
        ledger = self.ledger
        states = ledger._nodes
        shape = self.shape(demand)
        idx = self._index.get(shape)
        log = ledger.changes
        if idx is None or (log and log[0][0] > idx.seq + 1):
            # First use of this shape, or too many changes since: evaluate every node.
            if shape not in self._index and len(self._index) >= MAX_SHAPES:
                self._index.clear()  # pods' owners choose shapes: bound what they cost
            idx = self._index[shape] = _ShapeIndex()
            todo: Iterable[str] = list(states)
        else:
            # The log is in sequence order: read it from the newest end back to what we saw.
            recent: set[str] = set()
            for seq, name in reversed(log):
                if seq <= idx.seq:
                    break
                recent.add(name)
            todo = recent
        heap = idx.heap
        for name in todo:
            st = states.get(name)
            if st is None:
                continue
            ev = self._eval_node(name, st, shape, demand)
            if ev[0] == FEASIBLE:
                key: tuple[float, ...] = ev[1]  # type: ignore[assignment]
                heapq.heappush(heap, (key, name, st.version))
        idx.seq = ledger.seq
        while heap:
            _key, name, version = heap[0]
            st = states.get(name)
            if st is None or st.version != version:
                heapq.heappop(heap)
                continue
            if len(heap) > 4 * len(states) + 64:
                heap[:] = [e for e in heap if (s := states.get(e[1])) is not None and s.version == e[2]]
                heapq.heapify(heap)
            return name, self._eval_node(name, st, shape, demand)
        return None

    def decide(self, demand: Demand, nodes: Iterable[str] | None = None) -> Placement | Refusal:
        """The best placement for ``demand`` (on ``nodes`` only, if given), without committing it."""
        existing = self.ledger.allocation(demand.key)
        if existing is not None:
            return Refusal(
                demand.key, f"pod {demand.key} already holds cards on node {existing.node}", permanent=True
            )
        if nodes is None:
            best = self._best_anywhere(demand)
            if best is not None:
                return self.placement_on(demand, best[0], best[1][2])  # type: ignore[arg-type]
        feasible, not_now, never = self.candidates(demand, nodes)
        if not feasible:
            return self._refusal(demand, not_now, never)
        node = min(feasible, key=lambda n: (feasible[n][1], n))
        return self.placement_on(demand, node, feasible[node][2])  # type: ignore[arg-type]

    def placement_on(
        self, demand: Demand, node: str, chosen: tuple[tuple[Card, int], ...] | None = None
    ) -> Placement | Refusal:
        """The placement on one given node (the extender's bind), or why not."""
        if chosen is None:
            feasible, not_now, never = self.candidates(demand, [node])
            if node not in feasible:
                return self._refusal(demand, not_now, never)
            chosen = feasible[node][2]  # type: ignore[assignment]
        assert chosen is not None
        cards = tuple(
            CardShare(
                uuid=c.uuid, index=c.index, units=c.units if demand.per_card is None else demand.per_card
            )
            for c, _ in sorted(chosen, key=lambda cf: cf[0].index)
        )
        containers = self._container_shares(demand, cards)
        return Placement(
            key=demand.key,
            node=node,
            cards=cards,
            containers=containers,
            uid=demand.uid,
            policy=self.policy.name,
            cpu_milli=demand.cpu_milli,
            memory_mib=demand.memory_mib,
            asks_count=bool(demand.count_containers),
        )

    @staticmethod
    def _container_shares(demand: Demand, cards: tuple[CardShare, ...]) -> tuple[ContainerShare, ...]:
        """Each container's units split over the pod's cards as evenly as they go, the odd
        units on the first cards; a container's Allocate asks their sum (its handout: see
        handout.py). The split depends on the units alone, so that containers of one size
        want the same cards, as the handout rule needs."""
        n = len(cards)
        return tuple(
            ContainerShare(container=name, uuid=card.uuid, units=units // n + (j < units % n))
            for name, units in demand.containers
            for j, card in enumerate(cards)
            if units // n + (j < units % n)
        )

    def place_and_commit(self, demand: Demand, nodes: Iterable[str] | None = None) -> Placement | Refusal:
        decision = self.decide(demand, nodes)
        self.policy.observe(demand, isinstance(decision, Placement))
        if isinstance(decision, Placement):
            self.ledger.commit(decision)
        return decision

    def scores(self, demand: Demand, nodes: Iterable[str]) -> dict[str, int]:
        """Scores 0..10 for kube-scheduler's prioritize: the policy's favourite gets 10."""
        feasible, _, _ = self.candidates(demand, nodes)
        if not feasible:
            return {}
        keys = sorted({feasible[n][1] for n in feasible})  # type: ignore[type-var]
        if len(keys) == 1:
            return dict.fromkeys(feasible, 10)
        rank = {k: i for i, k in enumerate(keys)}
        return {n: round(10 * (1 - rank[feasible[n][1]] / (len(keys) - 1))) for n in sorted(feasible)}

    # ---- explaining -------------------------------------------------------------------
    def _refusal(self, demand: Demand, not_now_evals: dict[str, _Eval], never: dict[str, str]) -> Refusal:
        not_now = {n: str(ev[1]) for n, ev in not_now_evals.items()}
        names = self.names
        what = demand.describe(names)
        if not not_now:
            # Nothing could ever take it: say what the biggest allowed card is.
            sizes = [
                (c.units, c.model)
                for st in self.ledger._nodes.values()
                for c in st.node.cards
                if demand.model_allowed(c.model)
            ]
            if not sizes:
                models = "/".join(demand.models) or "GPU-sharing"
                reason = (
                    f"pod {demand.key} asks {what}, but the cluster has no {models} card"
                    + (f" (excluding {'/'.join(demand.exclude_models)})" if demand.exclude_models else "")
                    + "; remove the card-model restriction or add such a node"
                )
            elif demand.per_card is not None and demand.per_card > max(sizes)[0]:
                units, model = max(sizes)
                reason = (
                    f"pod {demand.key} asks {what}, but the largest {demand.model_phrase()}card holds "
                    f"{names.fmt(units)} ({model}); ask for at most {names.fmt(units)}, "
                    f"or for several cards with {names.count}"
                )
            else:
                first = next(iter(sorted(never.items())), ("", "no node fits"))[1]
                reason = f"pod {demand.key} asks {what}, which no node can ever hold: {first}"
            return Refusal(demand.key, reason, permanent=True, unresolvable=never)
        reason = self._summary(demand, not_now_evals, not_now)
        return Refusal(demand.key, reason, permanent=False, nodes=not_now, unresolvable=never)

    def _summary(self, demand: Demand, not_now: Mapping[str, _Eval], reasons: Mapping[str, str]) -> str:
        """One sentence a person reads: ``no Tesla-T4 card has 7 GiB free; ...``."""
        names = self.names
        host = sum(1 for r in reasons.values() if "CPU free" in r or "memory free" in r)
        if demand.per_card is not None and demand.count == 1 and host < len(reasons):
            # Largest free block among nodes whose CPU and memory would do.
            neg_free, node, index = min(
                (-int(ev[2]), n, int(ev[3]))  # type: ignore[call-overload]
                for n, ev in not_now.items()
                if "CPU free" not in ev[1] and "memory free" not in ev[1]  # type: ignore[operator]
            )
            free = -neg_free
            tail = f"; {host} more node(s) lack CPU or memory" if host else ""
            if free >= demand.per_card:  # room enough, held back for another reason
                return f"pod {demand.key}: {reasons[node]}{tail}"
            return (
                f"no {demand.model_phrase()}card has {names.fmt(demand.per_card)} free; the largest "
                f"free block is {names.fmt(free)} (node {node}, card {index}){tail}; "
                "the pod waits until a slice is released"
            )
        first = sorted(reasons.items())[0][1]
        return (
            f"pod {demand.key} asks {demand.describe(names)}, which no node has free now "
            f"({len(reasons)} node(s); e.g. {first}); it waits until capacity is released"
        )
