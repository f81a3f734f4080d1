"""The cluster a replay runs against, and how trace pods become demands.

A cluster is either the trace's node list (with each node's CPU and host
memory) or declared on the command line: ``"40x2 Tesla-T4:15360"`` is 40 nodes
with 2 Tesla-T4 cards of 15360 MiB each; several groups are separated by
commas; the MiB may be left out for models in :data:`KNOWN_MODELS`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core import planning
from ..core.cards import Card, Node
from ..core.declarations import CardGroup, DeclarationError, parse_card_groups
from ..core.demand import Demand
from ..core.ledger import Ledger
from ..core.resources import ResourceNames
from .trace import KNOWN_MODELS, TraceError, TraceNode, TracePod


def parse_cards(spec: str) -> list[CardGroup]:
    """``"40x2 Tesla-T4:15360, 4x8 A100-80GB"`` -> card groups (the core's one card declaration
    grammar, with a node count first), with a clear error otherwise."""
    try:
        return parse_card_groups(spec, flag="--cards", per_node=True, known=KNOWN_MODELS, unsized=True)
    except DeclarationError as err:
        raise TraceError(str(err)) from err


@dataclass(frozen=True)
class Units:
    """How GPU amounts are counted: ``milli`` (1000 per card) or ``slices`` (S per card).

    ``catalogue``: the slice sizes a spawn page offers, in slices, ascending. A sharing pod
    then gets the smallest size that holds its exact slices; a pod larger than every size
    gets a whole card. Empty: every pod gets its exact slices.
    """

    mode: str
    per_card: int
    catalogue: tuple[int, ...] = ()

    @property
    def names(self) -> ResourceNames:
        return ResourceNames(unit=self.mode)

    def exact_slices(self, gpu_milli: int) -> int:
        """A sharing pod's share of a card as whole slices: ``max(1, ceil(milli * S / 1000))``."""
        return max(1, math.ceil(gpu_milli * self.per_card / 1000))

    def sharing_units(self, gpu_milli: int) -> int | None:
        """Units a sharing pod asks on one card; ``None``: a whole card (above the catalogue)."""
        if self.mode == "milli":
            return gpu_milli
        exact = self.exact_slices(gpu_milli)
        if not self.catalogue:
            return exact
        return next((size for size in self.catalogue if size >= exact), None)

    def exact_units(self, pod: TracePod) -> int:
        """Units the pod asks before any catalogue: its exact slices (or milli), or whole cards."""
        if pod.num_gpu == 0:
            return 0
        if pod.sharing:
            return pod.gpu_milli if self.mode == "milli" else self.exact_slices(pod.gpu_milli)
        return self.per_card * pod.num_gpu

    def demand(self, pod: TracePod, key: str) -> Demand:
        if pod.num_gpu == 0:
            per, count = None, 0
        elif pod.sharing:
            per, count = self.sharing_units(pod.gpu_milli), 1
        else:
            per, count = None, pod.num_gpu
        return Demand(
            key=key,
            per_card=per,
            count=count,
            models=pod.gpu_spec,
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
        )

    def size(self, demand: Demand) -> int:
        """Units one card-item of this demand takes (whole cards: the full card)."""
        return self.per_card if demand.per_card is None else demand.per_card


def parse_catalogue(spec: str) -> tuple[int, ...]:
    """``"3,5,7"`` -> (3, 5, 7): slice sizes in slices, positive, each once, ascending (the
    planner's reading, with the replayer's error)."""
    try:
        return planning.parse_catalogue(spec, unit="slice")
    except planning.PlanningError as err:
        raise TraceError(f"--{err}") from None


def choose_units(
    mode: str, slices_per_card: int | None, mibs: set[int | None], catalogue: tuple[int, ...] = ()
) -> Units:
    if mode == "milli":
        if catalogue:
            raise TraceError("--catalogue needs --unit slices (its sizes are slices of a card)")
        return Units("milli", 1000)
    if slices_per_card is not None:
        if slices_per_card <= 0:
            raise TraceError(f"--slices-per-card must be positive, got {slices_per_card}")
        per_card = slices_per_card
    else:
        sizes = {m // 1024 for m in mibs if m is not None}
        if None in mibs or len(sizes) != 1:
            raise TraceError(
                "--unit slices: the cards' memory does not give one slice count per card "
                f"(MiB seen: {sorted(m for m in mibs if m is not None)}, unknown for some models); "
                "pass --slices-per-card S"
            )
        per_card = sizes.pop()
    too_big = [s for s in catalogue if s > per_card]
    if too_big:
        raise TraceError(
            f"--catalogue: {too_big[0]} slices is more than a card holds ({per_card}); "
            f"offer at most {per_card} (a whole card)"
        )
    return Units("slices", per_card, catalogue)


def ledger_from_groups(groups: list[CardGroup], units: Units) -> Ledger:
    ledger = Ledger(units.names)
    n = 0
    for g in groups:
        for _ in range(g.nodes):
            name = f"node-{n:04d}"
            n += 1
            cards = tuple(
                Card(index=i, uuid=f"GPU-{name}-{i}", model=g.key, units=units.per_card, mib=g.mib or 0)
                for i in range(g.count)
            )
            ledger.set_node(Node(name=name, cards=cards))
    return ledger


def ledger_from_trace(nodes: list[TraceNode], units: Units, host: bool) -> Ledger:
    """The trace's node list; ``host``: respect CPU and host memory as kube-scheduler would."""
    ledger = Ledger(units.names)
    for tn in nodes:
        cards = tuple(
            Card(
                index=i,
                uuid=f"GPU-{tn.name}-{i}",
                model=tn.model,
                units=units.per_card,
                mib=KNOWN_MODELS.get(tn.model) or 0,
            )
            for i in range(tn.gpus)
        )
        ledger.set_node(
            Node(
                name=tn.name,
                cards=cards,
                cpu_milli=tn.cpu_milli if host else None,
                memory_mib=tn.memory_mib if host else None,
            )
        )
    return ledger
