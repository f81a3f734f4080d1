"""What the extender answers, decided on the ledger alone (no I/O, no clock).

The HTTP layer parses requests and does the API calls; everything it decides
comes from here, so that it can be tested without a server and reused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpushare_hub.core import (
    DEFAULT_NAMES,
    Demand,
    GPUShareError,
    Ledger,
    Placement,
    Placer,
    PodObject,
    Refusal,
    ResourceNames,
    demand_from_pod,
    make_policy,
)
from gpushare_hub.core.objects import Taint
from gpushare_hub.core.policy import POLICIES
from gpushare_hub.core.queue import Waiter, WaitingLine, takes_their_turn, units_of
from gpushare_hub.core.verdict import explain

from .wire import ExtenderArgs

# The DRA packing the measurements chose (docs/measurements/2026-11-28-dra-packing.md): the
# driver's device order makes the allocator's first fit best fit on a node, and the node is
# binpack's choice.
DRA_POLICY = "binpack"


@dataclass
class FilterOutcome:
    passed: list[str]
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    error: str = ""
    demand: Demand | None = None


class Decisions:
    """Filter, prioritize and bind choices for one ledger, with a placer per policy."""

    def __init__(self, ledger: Ledger, policy: str = "binpack", names: ResourceNames = DEFAULT_NAMES) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(sorted(POLICIES))}")
        self.ledger = ledger
        self.names = names
        self.default_policy = policy
        self._placers: dict[str, Placer] = {}
        self.line = WaitingLine()  # spawns served in the order they were made
        self.node_labels: dict[str, Mapping[str, str]] = {}  # where a waiting spawn's selector may run
        self.node_taints: dict[str, tuple[Taint, ...]] = {}  # and which nodes its tolerations allow
        # Nodes whose cards hold more slices than their memory (the plugin's overcommit): room
        # there comes back when an idle notebook hibernates, which no event tells kube-scheduler.
        self.overcommitted: set[str] = set()

    def placer(self, policy: str | None = None) -> Placer:
        name = policy or self.default_policy
        if name not in self._placers:
            self._placers[name] = Placer(self.ledger, make_policy(name))
        return self._placers[name]

    def demand(self, pod: PodObject) -> Demand | None:
        """The pod's demand; raises GPUShareError with a message for a malformed one."""
        d = demand_from_pod(pod, self.names)
        if d is not None and d.policy and d.policy not in POLICIES:
            raise GPUShareError(
                f"pod {d.key}: annotation gpushare-hub.io/policy={d.policy!r} is not a policy; "
                f"use one of {', '.join(sorted(POLICIES))}"
            )
        return d

    def filter(self, args: ExtenderArgs) -> FilterOutcome:
        try:
            demand = self.demand(args.pod)
        except GPUShareError as err:
            return FilterOutcome(passed=[], error=str(err))
        if demand is None:  # asks for none of our resources: not ours to judge
            return FilterOutcome(passed=list(args.node_names))
        placer = self.placer(demand.policy)
        feasible, not_now, never = placer.candidates(demand, args.node_names)
        passed = [n for n in args.node_names if n in feasible]
        failed = {n: explain(v, demand, placer.names) for n, v in not_now.items()}
        unresolvable = {n: explain(v, demand, placer.names) for n, v in never.items()}
        held = sorted(n for n, v in not_now.items() if v.transient)
        for node in sorted(set(not_now) & self.overcommitted - set(held)):
            failed[node] += (
                f"; node {node} overcommits its cards: room comes back there when an idle notebook hibernates"
            )
            held.append(node)
        # First come, first served: a node's room goes to the spawns made earlier that wait for
        # it (the words name no other user's pod).
        created = args.pod.creation_timestamp
        self.line.seen(demand.key, created, demand, args.node_names)  # with the nodes it was offered
        if passed and self._their_turn(demand, created, passed):
            for node in passed:
                failed[node] = (
                    f"the free room on node {node} goes first to spawns made earlier that wait for it "
                    "(spawns are served in the order they were made)"
                )
            held += passed
            passed = []
        error = ""
        if not passed and held:
            # Only a short hold, or an older spawn's turn, stands in the way. As an error,
            # kube-scheduler retries the pod after its backoff (1-10 s); as a plain failure it
            # would park the pod until some cluster event it deems relevant, which a peer pod's
            # annotation (or its turn) is not.
            error = f"retrying shortly: {failed[sorted(held)[0]]}"
        return FilterOutcome(
            passed=passed, failed=failed, unresolvable=unresolvable, error=error, demand=demand
        )

    def _fits(self, demand: Demand, node: str) -> bool:
        return isinstance(self.placer(demand.policy).placement_on(demand, node), Placement)

    def _may_use(self, w: Waiter, node: str) -> bool:
        return w.may_use(node, self.node_labels.get(node) or {}, self.node_taints.get(node, ()))

    def _their_turn(self, demand: Demand, created: str, passed: list[str]) -> bool:
        """Whether taking room on ``passed`` now would leave too little for older spawns that wait
        there and fit there now."""
        mine = units_of(demand)
        if mine is None:
            return False  # whole cards: served as kube-scheduler tries them
        theirs = []
        for w in self.line.older(demand.key, created):
            need = units_of(w.demand)
            if need and any(self._may_use(w, n) and self._fits(w.demand, n) for n in passed):
                theirs.append(need)
        if not theirs:
            return False
        free = 0
        for name in passed:
            node = self.ledger.node(name)
            free += sum(self.ledger.free(name, c.uuid) for c in node.cards) if node is not None else 0
        return takes_their_turn(free, mine, theirs)

    def prioritize(self, args: ExtenderArgs) -> dict[str, int]:
        """Scores 0..10; an unreadable pod scores 0 everywhere (filter already said why)."""
        try:
            demand = self.demand(args.pod)
        except GPUShareError:
            return {}
        if demand is None:
            return {}
        return self.placer(demand.policy).scores(demand, args.node_names)

    def prioritize_dra(self, demand: Demand | None, nodes: list[str]) -> dict[str, int]:
        """Scores 0..10 of a DRA pod's slice (read from its claim's template): binpack's, the
        node choice of dra-ordered-binpack (core/drapacking.py); nodes where no card holds the
        slice score 0. The scheduler's DRA allocator picks the card; nothing here commits."""
        if demand is None:
            return {}
        return self.placer(DRA_POLICY).scores(demand, nodes)

    def bind(self, pod: PodObject, node: str) -> Placement | Refusal | None:
        """Choose the card(s) on ``node`` and record them as assumed. ``None``: no GPU asked."""
        demand = self.demand(pod)
        if demand is None:
            return None
        existing = self.ledger.allocation(demand.key)
        if existing is not None:
            # Never released here: the binder settles its own reservations, and a pod copy
            # from filter time may be older than a bind that went through.
            return Refusal(
                demand.key,
                f"pod {demand.key} already holds cards on node {existing.node} (a bind that is in "
                "flight or done); not placing it twice",
                permanent=False,
            )
        decision = self.placer(demand.policy).placement_on(demand, node)
        if isinstance(decision, Placement):
            self.ledger.commit(decision)
            self.line.drop(demand.key)
        return decision

    def card_units(self, placement: Placement) -> dict[str, int]:
        node = self.ledger.node(placement.node)
        assert node is not None
        return {c.uuid: c.units for c in node.cards}
