"""Placement: which node and which card(s) a demand goes to, or why it cannot go anywhere.

A :class:`Policy` ranks the feasible (node, cards) candidates; lower keys win and
ties fall to the node name and card index, so every decision is deterministic.

* ``binpack`` (default): the fullest card that fits (best fit), then the fullest node.
* ``spread``: the emptiest card, then the emptiest node (worst fit); each user
  gets the most headroom, at the price of more cards in use.
* ``fgd``: fragmentation gradient descent (Weng et al., ATC'23): the candidate that
  least increases the GPU capacity the expected workload could not use; node
  level, aware of CPU and host memory where the node tracks them.

Each node's answer is a :class:`~gpushare_hub.core.verdict.Verdict`: feasible, *not now*
(some card could hold it once others leave) or *never* (larger than any card the pod may
use), with a :class:`~gpushare_hub.core.verdict.Reason`. A refusal names the way out; its
words come from :func:`~gpushare_hub.core.verdict.explain` and :meth:`Placer._refusal`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

from .annotations import CardShare, ContainerShare
from .cards import Card, Node
from .demand import Demand
from .handout import Handout, first_conflict, handouts, waiting_by_size
from .isolation import WORDS, satisfies
from .ledger import Ledger, NodeState, Placement
from .resources import ResourceNames
from .verdict import Kind, Reason, Verdict, explain


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
    """Why a demand was not placed. ``permanent``: it never fits as asked.

    ``reason`` is the sentence for people; ``verdicts`` holds the refusing nodes' verdicts for
    code to act on, and ``nodes`` (not now) and ``unresolvable`` (never) say them per node in
    words, made only when read (a spawn form's availability asks every node and reads none).
    """

    key: str
    reason: str
    permanent: bool
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)
    demand: Demand | None = field(default=None, repr=False, compare=False)
    names: ResourceNames | None = field(default=None, repr=False, compare=False)

    def _words(self, kind: Kind) -> dict[str, str]:
        if self.demand is None or self.names is None:
            return {}
        return {n: explain(v, self.demand, self.names) for n, v in self.verdicts.items() if v.kind is kind}

    @cached_property
    def nodes(self) -> Mapping[str, str]:
        return self._words(Kind.NOT_NOW)

    @cached_property
    def unresolvable(self) -> Mapping[str, str]:
        return self._words(Kind.NEVER)


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


# Distinct demand shapes cached (per node, and heaps over all nodes). Real pods come in a few
# shapes (the catalogue's slices); past this many the cache starts again rather than grow.
MAX_SHAPES = 1024
_HOST = frozenset({Reason.CPU, Reason.MEMORY})
Fitting = list[tuple[Card, int]]  # cards that could take the demand, with their free units


class _ShapeIndex:
    """Feasible nodes for one demand shape, in a heap ordered by the policy's key.

    Entries of nodes that changed since are stale; they are skipped when popped,
    and changed nodes are re-evaluated from the ledger's change log.
    """

    __slots__ = ("heap", "seq")

    def __init__(self) -> None:
        self.heap: list[tuple[tuple[float, ...], str, int]] = []
        self.seq = -1


# ---- the steps of one node's verdict: each returns the refusal, or None (or the cards that fit) ----
def _largest_block(view: NodeView) -> tuple[int, int]:
    """The largest free block on a card the pod may use, and that card's index ((0, -1): none)."""
    if not view.cards:
        return 0, -1
    card, free = max(view.cards, key=lambda cf: (cf[1], -cf[0].index))
    return free, card.index


def _not_now(
    view: NodeView,
    reason: Reason,
    block: tuple[int, int],
    have: int = 0,
    asked: int = 0,
    cards: tuple[int, ...] = (),
) -> Verdict:
    free, card = block
    return Verdict(view.name, Kind.NOT_NOW, reason, have, asked, free, card, cards=cards)


def _host_short(node: Node, view: NodeView, demand: Demand, block: tuple[int, int]) -> Verdict | None:
    """CPU, then host memory, where the node tracks them (the replayer's nodes)."""
    if view.cpu_free is not None and demand.cpu_milli > view.cpu_free:
        return _short(node, view, Reason.CPU, view.cpu_free, node.cpu_milli, demand.cpu_milli, block)
    if view.memory_free is not None and demand.memory_mib > view.memory_free:
        return _short(node, view, Reason.MEMORY, view.memory_free, node.memory_mib, demand.memory_mib, block)
    return None


def _short(
    node: Node,
    view: NodeView,
    reason: Reason,
    free: int,
    total: int | None,
    asked: int,
    block: tuple[int, int],
) -> Verdict:
    """Short of CPU or host memory: for good if the whole node has too little."""
    if total is not None and asked > total:
        return Verdict(node.name, Kind.NEVER, reason, have=total, asked=asked)
    return _not_now(view, reason, block, have=free, asked=asked)


def _no_usable_card(node: Node, view: NodeView, demand: Demand, block: tuple[int, int]) -> Verdict | None:
    """No healthy card of a model the pod allows."""
    if view.cards:
        return None
    if demand.models or demand.exclude_models:
        models = tuple(sorted({c.model for c in node.cards}))
        return Verdict(node.name, Kind.NEVER, Reason.MODEL, models=models)
    return _not_now(view, Reason.UNHEALTHY, block)


def _wrong_tier(node: Node, demand: Demand) -> Verdict | None:
    tier = node.isolation.effective
    if satisfies(tier, demand.isolation):
        return None
    return Verdict(node.name, Kind.NEVER, Reason.ISOLATION, detail=tier)


def _too_few_cards(view: NodeView, demand: Demand) -> Verdict | None:
    if len(view.cards) >= demand.count:
        return None
    return Verdict(view.name, Kind.NEVER, Reason.TOO_FEW_CARDS, have=len(view.cards), asked=demand.count)


def _too_big(view: NodeView, demand: Demand) -> Verdict | None:
    """A slice larger than every card the pod may use here."""
    if demand.per_card is None:
        return None
    largest = max(c.units for c, _ in view.cards)
    if demand.per_card <= largest:
        return None
    return Verdict(view.name, Kind.NEVER, Reason.TOO_BIG, have=largest, asked=demand.per_card)


def _empty_cards(view: NodeView, demand: Demand, block: tuple[int, int]) -> Fitting | Verdict:
    """Whole cards: the empty ones, if there are enough."""
    empty = [(c, f) for c, f in view.cards if f == c.units]
    if len(empty) < demand.count:
        return _not_now(view, Reason.NO_EMPTY_CARDS, block, have=len(empty), asked=demand.count)
    return empty


class Placer:
    """Places demands on a ledger with a policy. Caches per-node verdicts.

    A node's verdict for a given demand shape only changes when the node
    changes, so it is cached under the node's version; a per-shape heap of
    feasible nodes lets :meth:`decide` over the whole cluster touch only the
    nodes that changed since that shape was last placed. This is what keeps a
    1,000-node replay fast. The placer writes the ledger only in
    :meth:`place_and_commit`.
    """

    def __init__(self, ledger: Ledger, policy: Policy | str = "binpack") -> None:
        self.ledger = ledger
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self._cache: dict[str, tuple[int, dict[tuple[object, ...], Verdict]]] = {}
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
            demand.isolation,
        )

    # ---- one node -----------------------------------------------------------------
    def _view(self, st: NodeState, demand: Demand) -> NodeView:
        node, used = st.node, st.used
        # (list comprehensions: this runs for every node a demand shape meets)
        every = tuple([(c, max(0, c.units - used.get(c.uuid, 0))) for c in node.cards])
        if demand.models or demand.exclude_models:
            allowed = tuple([cf for cf in every if cf[0].healthy and demand.model_allowed(cf[0].model)])
        else:
            allowed = tuple([cf for cf in every if cf[0].healthy])
        return NodeView(
            name=node.name,
            cards=allowed,
            units=sum([c.units for c, _ in every]),
            free_units=sum([f for _, f in every]),
            cpu_free=None if node.cpu_milli is None else node.cpu_milli - st.cpu_used,
            memory_free=None if node.memory_mib is None else node.memory_mib - st.memory_used,
            cpu_total=node.cpu_milli,
            all_cards=every,
        )

    def _evaluate(self, st: NodeState, demand: Demand) -> Verdict:
        """The node's verdict: the first step that refuses, else the cards the policy chooses."""
        node = st.node
        view = self._view(st, demand)
        block = _largest_block(view)
        refused = _wrong_tier(node, demand) or _host_short(node, view, demand, block)
        if refused is None and not demand.wants_gpu:
            return Verdict(node.name, Kind.FEASIBLE, rank=self.policy.node_key(view, (), demand, 0))
        refused = (
            refused
            or _no_usable_card(node, view, demand, block)
            or self._handing_cards(st, view, demand, block)
            or _too_few_cards(view, demand)
            or _too_big(view, demand)
        )
        if refused is not None:
            return refused
        if demand.per_card is None:
            fitting = _empty_cards(view, demand, block)
        else:
            fitting = self._room_for_slices(st, view, demand, block)
        if isinstance(fitting, Verdict):
            return fitting
        return self._choose(view, demand, fitting)

    @staticmethod
    def _handing_cards(
        st: NodeState, view: NodeView, demand: Demand, block: tuple[int, int]
    ) -> Verdict | None:
        """Whole-card handouts (gpu-count Allocate) follow the rule of handout.py too, in its
        strictest form: one pod asking gpu-count at a time per node until the plugin served it."""
        if not (demand.count_containers and st.node.allocator):
            return None
        if any(a.asks_count and not a.assigned and a.key != demand.key for a in st.pods.values()):
            return _not_now(view, Reason.HANDING_CARDS, block)
        return None

    def _room_for_slices(
        self, st: NodeState, view: NodeView, demand: Demand, block: tuple[int, int]
    ) -> Fitting | Verdict:
        """Slices: the cards with the slice free (that the handout rule lets us use), if enough."""
        per_card = demand.per_card or 0
        fitting = [(c, f) for c, f in view.cards if f >= per_card]
        if st.node.allocator:
            waiting = self._waiting(st)
            if waiting:
                held = self._held_back(st.node, view, demand, fitting, waiting, block)
                if isinstance(held, Verdict):
                    return held
                fitting = held
        if len(fitting) < demand.count:
            sick = tuple(c.index for c in st.node.cards if not c.healthy)
            return _not_now(view, Reason.NO_ROOM, block, have=len(fitting), asked=demand.count, cards=sick)
        return fitting

    def _choose(self, view: NodeView, demand: Demand, fitting: Fitting) -> Verdict:
        """Feasible: the cards the policy ranks first, and the node's rank."""
        pol = self.policy
        take = demand.per_card
        ranked = sorted(
            fitting,
            key=lambda cf: pol.card_key(view, cf[0], cf[1], cf[0].units if take is None else take),
        )
        chosen = tuple(ranked[: demand.count])
        rank = pol.node_key(view, chosen, demand, chosen[0][0].units if take is None else take)
        return Verdict(view.name, Kind.FEASIBLE, rank=rank, chosen=chosen)

    @staticmethod
    def _waiting(st: NodeState) -> dict[int, set[tuple[str, ...]]]:
        """Unserved handouts on the node, by size (see :mod:`~gpushare_hub.core.handout`)."""
        return waiting_by_size(handouts(a.containers) for a in st.pods.values() if not a.assigned)

    def _held_back(
        self,
        node: Node,
        view: NodeView,
        demand: Demand,
        fitting: Fitting,
        waiting: dict[int, set[tuple[str, ...]]],
        block: tuple[int, int],
    ) -> Fitting | Verdict:
        """The fitting cards on which the pod's handouts keep the rule of
        :mod:`~gpushare_hub.core.handout`, or why the pod waits.

        The device plugin's Allocate learns only how many units a container gets,
        not which pod it is for. Keeping every unserved handout of one size on one
        card makes its answer right whichever of those containers it is serving;
        the plugin then marks the pod assigned and the next may go elsewhere.
        """
        sizes = [units for _, units in demand.containers] or [demand.per_card or 0]
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
        held, uuids = conflict
        index = {c.uuid: c.index for c in node.cards}
        cards = tuple(index.get(u, -1) for u in uuids)
        return _not_now(view, Reason.HANDING_SLICE, block, asked=held.size, cards=cards)

    def _eval_node(self, name: str, st: NodeState, shape: tuple[object, ...], demand: Demand) -> Verdict:
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

    def verdict(self, name: str, demand: Demand) -> Verdict:
        """Node ``name``'s verdict on ``demand`` (a node the ledger does not know never fits)."""
        st = self.ledger.state(name)
        if st is None:
            why = self.ledger.unreadable(name)
            if why is None:
                return Verdict(name, Kind.NEVER, Reason.NO_CARDS)
            return Verdict(name, Kind.NEVER, Reason.UNREADABLE, detail=why)
        return self._eval_node(name, st, self.shape(demand), demand)

    # ---- many nodes ---------------------------------------------------------------
    def candidates(
        self, demand: Demand, nodes: Iterable[str] | None = None
    ) -> tuple[dict[str, Verdict], dict[str, Verdict], dict[str, Verdict]]:
        """Verdicts on ``nodes`` (default: all), split by kind: (feasible, not now, never) by node name."""
        feasible: dict[str, Verdict] = {}
        not_now: dict[str, Verdict] = {}
        never: dict[str, Verdict] = {}
        split = {Kind.FEASIBLE: feasible, Kind.NOT_NOW: not_now, Kind.NEVER: never}
        states = self.ledger.states()
        shape = self.shape(demand)  # once, not per node: this loop runs for every filter
        cache = self._cache
        for name in states if nodes is None else nodes:
            st = states.get(name)
            if st is None:
                v = self.verdict(name, demand)
            else:
                # _eval_node's cache hit, inline: this line runs for every node of every filter.
                entry = cache.get(name)
                hit = entry[1].get(shape) if entry is not None and entry[0] == st.version else None
                v = hit if hit is not None else self._eval_node(name, st, shape, demand)
            if v.kind is Kind.FEASIBLE:
                feasible[name] = v
            else:
                split[v.kind][name] = v
        return feasible, not_now, never

    def _best_anywhere(self, demand: Demand) -> Verdict | None:
        """The policy's favourite node in the whole ledger, via the shape's heap."""
        ledger = self.ledger
        states = ledger.states()
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
            v = self._eval_node(name, st, shape, demand)
            if v.kind is Kind.FEASIBLE:
                heapq.heappush(heap, (v.rank, name, st.version))
        idx.seq = ledger.seq
        while heap:
            _rank, name, version = heap[0]
            st = states.get(name)
            if st is None or st.version != version:
                heapq.heappop(heap)
                continue
            if len(heap) > 4 * len(states) + 64:
                heap[:] = [e for e in heap if (s := states.get(e[1])) is not None and s.version == e[2]]
                heapq.heapify(heap)
            return self._eval_node(name, st, shape, demand)
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
                return self.placement_on(demand, best.node, best.chosen)
        feasible, not_now, never = self.candidates(demand, nodes)
        if not feasible:
            return self._refusal(demand, not_now, never)
        node = min(feasible, key=lambda n: (feasible[n].rank, n))
        return self.placement_on(demand, node, feasible[node].chosen)

    def placement_on(
        self, demand: Demand, node: str, chosen: tuple[tuple[Card, int], ...] | None = None
    ) -> Placement | Refusal:
        """The placement on one given node (the extender's bind), or why not."""
        if chosen is None:
            feasible, not_now, never = self.candidates(demand, [node])
            if node not in feasible:
                return self._refusal(demand, not_now, never)
            chosen = feasible[node].chosen
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

    def place_if_room(self, demand: Demand) -> Placement | None:
        """Place and commit ``demand`` where :meth:`place_and_commit` would, or None when no node
        has room now, without saying why (a replay that only needs to know saves the words)."""
        best = self._best_anywhere(demand) if self.ledger.allocation(demand.key) is None else None
        decision = None if best is None else self.placement_on(demand, best.node, best.chosen)
        placed = isinstance(decision, Placement)
        self.policy.observe(demand, placed)
        if not isinstance(decision, Placement):
            return None
        self.ledger.commit(decision)
        return decision

    def scores(self, demand: Demand, nodes: Iterable[str]) -> dict[str, int]:
        """Scores 0..10 for kube-scheduler's prioritize: the policy's favourite gets 10."""
        feasible, _, _ = self.candidates(demand, nodes)
        if not feasible:
            return {}
        ranks = sorted({v.rank for v in feasible.values()})
        if len(ranks) == 1:
            return dict.fromkeys(feasible, 10)
        place = {k: i for i, k in enumerate(ranks)}
        return {n: round(10 * (1 - place[feasible[n].rank] / (len(ranks) - 1))) for n in sorted(feasible)}

    # ---- explaining -------------------------------------------------------------------
    def _refusal(self, demand: Demand, not_now: dict[str, Verdict], never: dict[str, Verdict]) -> Refusal:
        names = self.names
        verdicts = {**not_now, **never}
        what = demand.describe(names)
        if not not_now and demand.isolation and all(v.reason is Reason.ISOLATION for v in never.values()):
            tiers = sorted({v.detail for v in never.values()})
            reason = (
                f"pod {demand.key} asks {what} with a {WORDS[demand.isolation]}, but no node enforces "
                f"{demand.isolation} isolation (the nodes enforce {', '.join(tiers) or 'nothing'}); choose "
                f"a slice without this requirement, or enable {demand.isolation} on a GPU node"
            )
            return Refusal(demand.key, reason, True, verdicts, demand, names)
        if not not_now:
            # Nothing could ever take it: say what the biggest allowed card is.
            sizes = [
                (c.units, c.model)
                for st in self.ledger.states().values()
                if satisfies(st.node.isolation.effective, demand.isolation)
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
                first = explain(never[min(never)], demand, names) if never else "no node fits"
                reason = f"pod {demand.key} asks {what}, which no node can ever hold: {first}"
            return Refusal(demand.key, reason, True, verdicts, demand, names)
        return Refusal(demand.key, self._summary(demand, not_now), False, verdicts, demand, names)

    def _summary(self, demand: Demand, not_now: Mapping[str, Verdict]) -> str:
        """One sentence a person reads: ``no Tesla-T4 card has 7 GiB free; ...``."""
        names = self.names
        host = sum(1 for v in not_now.values() if v.reason in _HOST)
        if demand.per_card is not None and demand.count == 1 and host < len(not_now):
            # Largest free block among nodes whose CPU and memory would do.
            neg_free, node, index = min(
                (-v.free, n, v.card) for n, v in not_now.items() if v.reason not in _HOST
            )
            free = -neg_free
            tail = f"; {host} more node(s) lack CPU or memory" if host else ""
            if free >= demand.per_card:  # room enough, held back for another reason
                return f"pod {demand.key}: {explain(not_now[node], demand, names)}{tail}"
            return (
                f"no {demand.model_phrase()}card{demand.tier_phrase()} has {names.fmt(demand.per_card)} "
                "free; the largest "
                f"free block is {names.fmt(free)} (node {node}, card {index}){tail}; "
                "the pod waits until a slice is released"
            )
        first = explain(not_now[min(not_now)], demand, names)
        return (
            f"pod {demand.key} asks {demand.describe(names)}, which no node has free now "
            f"({len(not_now)} node(s); e.g. {first}); it waits until capacity is released"
        )
