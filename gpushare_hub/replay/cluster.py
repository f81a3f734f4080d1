"""The cluster a replay runs against, and how trace pods become demands.

A cluster is either the trace's node list (with each node's CPU and host
memory) or declared on the command line: ``"40x2 Tesla-T4:15360"`` is 40 nodes
with 2 Tesla-T4 cards of 15360 MiB each; several groups are separated by
commas; the MiB may be left out for models in :data:`KNOWN_MODELS`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..core.cards import Card, Node, normalize_model
from ..core.demand import Demand
from ..core.ledger import Ledger
from ..core.resources import ResourceNames
from .trace import KNOWN_MODELS, TraceError, TraceNode, TracePod

_GROUP = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s+([^:,]+?)\s*(?::\s*(\d+))?\s*$")


@dataclass(frozen=True)
class CardGroup:
    nodes: int
    cards: int
    model: str
    mib: int | None


def parse_cards(spec: str) -> list[CardGroup]:
    """``"40x2 Tesla-T4:15360, 4x8 A100-80GB"`` -> card groups, with a clear error otherwise."""
    groups = []
    for part in spec.split(","):
        m = _GROUP.match(part)
        if not m:
            raise TraceError(
                f"--cards: cannot read {part.strip()!r}; write NODESxCARDS MODEL[:MiB], "
                "e.g. '40x2 Tesla-T4:15360'"
            )
        nodes, cards, model, mib = int(m[1]), int(m[2]), normalize_model(m[3]), m[4]
        if nodes <= 0 or cards <= 0:
            raise TraceError(f"--cards: {part.strip()!r} needs at least one node and one card")
        if mib is None and model not in KNOWN_MODELS:
            raise TraceError(
                f"--cards: unknown card model {model!r} in {part.strip()!r}; give its memory as "
                f"{model}:MiB or use one of {', '.join(sorted(KNOWN_MODELS))}"
            )
        size = int(mib) if mib is not None else KNOWN_MODELS[model]
        groups.append(CardGroup(nodes, cards, model, size))
    return groups


@dataclass(frozen=True)
class Units:
    """How GPU amounts are counted: ``milli`` (1000 per card) or ``slices`` (S per card)."""

    mode: str
    per_card: int

    @property
    def names(self) -> ResourceNames:
        return ResourceNames(unit=self.mode)

    def demand(self, pod: TracePod, key: str) -> Demand:
        if pod.num_gpu == 0:
            per, count = None, 0
        elif pod.sharing:
            per = (
                pod.gpu_milli
                if self.mode == "milli"
                else max(1, math.ceil(pod.gpu_milli * self.per_card / 1000))
            )
            count = 1
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


def choose_units(mode: str, slices_per_card: int | None, mibs: set[int | None]) -> Units:
    if mode == "milli":
        return Units("milli", 1000)
    if slices_per_card is not None:
        if slices_per_card <= 0:
            raise TraceError(f"--slices-per-card must be positive, got {slices_per_card}")
        return Units("slices", slices_per_card)
    sizes = {m // 1024 for m in mibs if m is not None}
    if None in mibs or len(sizes) != 1:
        raise TraceError(
            "--unit slices: the cards' memory does not give one slice count per card "
            f"(MiB seen: {sorted(m for m in mibs if m is not None)}, unknown for some models); "
            "pass --slices-per-card S"
        )
    return Units("slices", sizes.pop())


def ledger_from_groups(groups: list[CardGroup], units: Units) -> Ledger:
    ledger = Ledger(units.names)
    n = 0
    for g in groups:
        for _ in range(g.nodes):
            name = f"node-{n:04d}"
            n += 1
            cards = tuple(
                Card(index=i, uuid=f"GPU-{name}-{i}", model=g.model, units=units.per_card, mib=g.mib or 0)
                for i in range(g.cards)
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
