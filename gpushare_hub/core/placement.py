"""What the ledger (:mod:`.ledger`) keeps per node and what a placer hands it: a node's state
(:class:`NodeState`: its cards and the units its pods hold), a decision (:class:`Placement`),
and the error of a decision that does not fit (:class:`OverCommit`). Pure.

:mod:`.ledger` re-exports the three; its claim book (:mod:`.claimbook`) reads node states
without knowing the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .annotations import AllocationRecord, CardShare, ContainerShare
from .cards import Card, Node
from .errors import GPUShareError
from .records import Allocation

__all__ = ["NodeState", "OverCommit", "Placement"]


class OverCommit(GPUShareError):
    """A placement would give a card more units than it has. A bug in the caller."""


@dataclass(frozen=True)
class Placement:
    """A decision: this pod's units go onto these cards of this node."""

    key: str
    node: str
    cards: tuple[CardShare, ...]
    containers: tuple[ContainerShare, ...] = ()
    uid: str = ""
    policy: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    asks_count: bool = False

    def record(self) -> AllocationRecord:
        return AllocationRecord(node=self.node, cards=self.cards, containers=self.containers)


@dataclass
class NodeState:
    """One node in the ledger: its cards, what its pods hold, and a version that changes with it.

    The placer reads it (:meth:`.ledger.Ledger.state`, :meth:`.ledger.Ledger.states`); only the
    ledger's own methods change it.
    """

    node: Node
    used: dict[str, int] = field(default_factory=dict)
    cpu_used: int = 0
    memory_used: int = 0
    version: int = 0
    pods: dict[str, Allocation] = field(default_factory=dict)

    def free(self, card: Card) -> int:
        return max(0, card.units - self.used.get(card.uuid, 0))
