"""Placement: which node and which card(s) a demand goes to, or why it cannot go anywhere.

A :class:`Policy` ranks the feasible (node, cards) candidates; lower keys win and
ties fall to the node name and card index, so every decision is deterministic.

* ``binpack`` (default): the fullest card that fits (best fit), then the fullest node.
  A tie between equally full cards prefers the one whose leftover can still be
  used by the slice sizes seen in the workload (see :class:`Binpack`).
* ``spread``: the emptiest card, then the emptiest node (worst fit); each user
  gets the most headroom, at the price of more cards in use.
* ``fgd``: fragmentation gradient descent (Weng et al., ATC'23): the candidate that
  least increases the GPU capacity the expected workload could not use; node
  level, aware of CPU and host memory where the node tracks them.

Refusals distinguish *not now* (some card could hold it once others leave) from
*never* (larger than any card the pod may use), and name the way out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from .annotations import CardShare, ContainerShare
from .cards import Card
from .demand import Demand
from .ledger import Ledger, Placement, _NodeState
from .resources import ResourceNames


@dataclass(frozen=True)
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
    """Best fit: the card left with the least free memory, then the node left fullest.

    Among cards that would be left equally full, one whose leftover no common
    slice size can use is avoided when another choice exists: ``sizes`` holds the
    slice sizes seen so far (or an admin's profile sizes) and their frequency.
    """

    name = "binpack"

    def __init__(self, sizes: Mapping[int, float] | None = None) -> None:
        self.sizes: Counter[int] = Counter(sizes or {})

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

    def observe(self, demand: Demand, placed: bool) -> None:
        if demand.per_card is not None:
            self.sizes[demand.per_card] += 1


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


_Candidate = tuple[tuple[float, ...], tuple[tuple[Card, int], ...]]
# (never?, reason) for a node that cannot take the demand.
_NodeNo = tuple[bool, str]


class Placer:
    """Places demands on a ledger with a policy. Caches per-node evaluations.

    A node's evaluation for a given demand shape only changes when the node
    changes, so it is cached under the node's version; this is what keeps a
    1,000-node replay fast. The placer never writes the ledger except in
    :meth:`place_and_commit`.
    """

    def __init__(self, ledger: Ledger, policy: Policy | str = "binpack") -> None:
        self.ledger = ledger
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self._cache: dict[str, tuple[int, dict[tuple[object, ...], _Candidate | _NodeNo]]] = {}

    @property
    def names(self) -> ResourceNames:
        return self.ledger.names

    # ---- one node -----------------------------------------------------------------
    def _view(self, st: _NodeState, demand: Demand) -> NodeView:
        allowed = tuple((c, st.free(c)) for c in st.node.cards if c.healthy and demand.model_allowed(c.model))
        every = tuple((c, st.free(c)) for c in st.node.cards)
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

    def _evaluate(self, st: _NodeState, demand: Demand) -> _Candidate | _NodeNo:
        names = self.names
        node = st.node
        view = self._view(st, demand)
        if view.cpu_free is not None and demand.cpu_milli > view.cpu_free:
            never = node.cpu_milli is not None and demand.cpu_milli > node.cpu_milli
            return (
                never,
                f"node {node.name} has {view.cpu_free}m CPU free, the pod asks {demand.cpu_milli}m",
            )
        if view.memory_free is not None and demand.memory_mib > view.memory_free:
            never = node.memory_mib is not None and demand.memory_mib > node.memory_mib
            return (
                never,
                f"node {node.name} has {view.memory_free} MiB memory free, "
                f"the pod asks {demand.memory_mib} MiB",
            )
        if not demand.wants_gpu:
            return (self.policy.node_key(view, (), demand, 0), ())
        usable = [c for c, _ in view.cards]
        if not usable:
            models = sorted({c.model for c in node.cards})
            if demand.models or demand.exclude_models:
                return (
                    True,
                    f"node {node.name} has no card of an allowed model (it has {', '.join(models)})",
                )
            return (False, f"node {node.name}: every card is unhealthy")
        count = demand.count
        if len(usable) < count:
            return (
                True,
                f"node {node.name} has {len(usable)} usable {demand.model_phrase()}card(s), "
                f"the pod asks {count}",
            )
        if demand.per_card is None:
            fitting = [(c, f) for c, f in view.cards if f == c.units]
            if len(fitting) < count:
                return (
                    False,
                    f"node {node.name} has {len(fitting)} empty {demand.model_phrase()}card(s), "
                    f"the pod asks {count} whole card(s)",
                )
        else:
            largest = max(c.units for c in usable)
            if demand.per_card > largest:
                return (
                    True,
                    f"{demand.model_phrase()}cards on node {node.name} hold at most "
                    f"{names.fmt(largest)}, the pod asks {names.fmt(demand.per_card)} on one card",
                )
            fitting = [(c, f) for c, f in view.cards if f >= demand.per_card]
            if len(fitting) < count:
                best_card, best_free = max(view.cards, key=lambda cf: (cf[1], -cf[0].index))
                if count == 1:
                    return (
                        False,
                        f"no {demand.model_phrase()}card on node {node.name} has "
                        f"{names.fmt(demand.per_card)} free; the largest free block is "
                        f"{names.fmt(best_free)} (card {best_card.index})",
                    )
                return (
                    False,
                    f"node {node.name} has {len(fitting)} {demand.model_phrase()}card(s) with "
                    f"{names.fmt(demand.per_card)} free, the pod asks {count}",
                )
        pol = self.policy
        ranked = sorted(
            fitting,
            key=lambda cf: pol.card_key(
                view, cf[0], cf[1], cf[0].units if demand.per_card is None else demand.per_card
            ),
        )
        chosen = tuple(ranked[:count])
        take = chosen[0][0].units if demand.per_card is None else demand.per_card
        return (pol.node_key(view, chosen, demand, take), chosen)

    def _cached(self, name: str, demand: Demand) -> _Candidate | _NodeNo:
        st = self.ledger._nodes[name]
        shape = (
            demand.per_card,
            demand.count,
            demand.models,
            demand.exclude_models,
            demand.cpu_milli,
            demand.memory_mib,
        )
        entry = self._cache.get(name)
        if entry is None or entry[0] != st.version:
            entry = (st.version, {})
            self._cache[name] = entry
        hit = entry[1].get(shape)
        if hit is None:
            hit = self._evaluate(st, demand)
            entry[1][shape] = hit
        return hit

    # ---- many nodes ---------------------------------------------------------------
    def candidates(
        self, demand: Demand, nodes: Iterable[str] | None = None
    ) -> tuple[dict[str, _Candidate], dict[str, str], dict[str, str]]:
        """Feasible nodes with their ranked choice, and the reasons for the others.

        Returns (feasible, not_now, never): node -> candidate / reason.
        """
        feasible: dict[str, _Candidate] = {}
        not_now: dict[str, str] = {}
        never: dict[str, str] = {}
        names = self.ledger._nodes.keys() if nodes is None else nodes
        for name in names:
            if name not in self.ledger._nodes:
                never[name] = f"node {name} offers no {self.names.memory} (no GPU-sharing cards known)"
                continue
            result = self._cached(name, demand)
            if isinstance(result[0], bool):
                (never if result[0] else not_now)[name] = str(result[1])
            else:
                feasible[name] = result  # type: ignore[assignment]
        return feasible, not_now, never

    def decide(self, demand: Demand, nodes: Iterable[str] | None = None) -> Placement | Refusal:
        """The best placement for ``demand`` (on ``nodes`` only, if given), without committing it."""
        existing = self.ledger.allocation(demand.key)
        if existing is not None:
            return Refusal(
                demand.key, f"pod {demand.key} already holds cards on node {existing.node}", permanent=True
            )
        feasible, not_now, never = self.candidates(demand, nodes)
        if not feasible:
            return self._refusal(demand, not_now, never)
        node = min(feasible, key=lambda n: (feasible[n][0], n))
        return self.placement_on(demand, node, feasible[node][1])

    def placement_on(
        self, demand: Demand, node: str, chosen: tuple[tuple[Card, int], ...] | None = None
    ) -> Placement | Refusal:
        """The placement on one given node (the extender's bind), or why not."""
        if chosen is None:
            feasible, not_now, never = self.candidates(demand, [node])
            if node not in feasible:
                return self._refusal(demand, not_now, never)
            chosen = feasible[node][1]
        cards = tuple(
            CardShare(
                uuid=c.uuid, index=c.index, units=c.units if demand.per_card is None else demand.per_card
            )
            for c, _ in sorted(chosen, key=lambda cf: cf[0].index)
        )
        containers = (
            tuple(
                ContainerShare(container=name, uuid=cards[0].uuid, units=units)
                for name, units in demand.containers
            )
            if len(cards) == 1
            else ()
        )
        return Placement(
            key=demand.key,
            node=node,
            cards=cards,
            containers=containers,
            uid=demand.uid,
            policy=self.policy.name,
            cpu_milli=demand.cpu_milli,
            memory_mib=demand.memory_mib,
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
        ordered = sorted(feasible, key=lambda n: (feasible[n][0], n))
        if not ordered:
            return {}
        keys = sorted({feasible[n][0] for n in ordered})
        if len(keys) == 1:
            return dict.fromkeys(ordered, 10)
        rank = {k: i for i, k in enumerate(keys)}
        return {n: round(10 * (1 - rank[feasible[n][0]] / (len(keys) - 1))) for n in ordered}

    # ---- explaining -------------------------------------------------------------------
    def _refusal(self, demand: Demand, not_now: dict[str, str], never: dict[str, str]) -> Refusal:
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
        reason = self._summary(demand, not_now)
        return Refusal(demand.key, reason, permanent=False, nodes=not_now, unresolvable=never)

    def _summary(self, demand: Demand, not_now: Mapping[str, str]) -> str:
        """One sentence a person reads: ``no Tesla-T4 card has 7 GiB free; ...``."""
        names = self.names
        if demand.per_card is not None and demand.count == 1:
            best: tuple[int, str, int] | None = None
            for name in not_now:
                st = self.ledger._nodes.get(name)
                if st is None:
                    continue
                for c in st.node.cards:
                    if c.healthy and demand.model_allowed(c.model):
                        f = st.free(c)
                        if best is None or (f, best[1], -c.index) > (best[0], name, -best[2]):
                            best = (f, name, c.index)
            if best is not None:
                host = [r for r in not_now.values() if "CPU" in r or "memory free" in r]
                tail = f"; {len(host)} node(s) lack CPU or memory" if host else ""
                return (
                    f"no {demand.model_phrase()}card has {names.fmt(demand.per_card)} free; the largest "
                    f"free block is {names.fmt(best[0])} (node {best[1]}, card {best[2]}){tail}; "
                    "the pod waits until a slice is released"
                )
        first = sorted(not_now.items())[0][1]
        return (
            f"pod {demand.key} asks {demand.describe(names)}, which no node has free now "
            f"({len(not_now)} node(s); e.g. {first}); it waits until capacity is released"
        )
