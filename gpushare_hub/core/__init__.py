"""The placement core: pure code, no I/O. Every component uses this one copy.

Modules import downwards only: ``names`` (every annotation, label and event reason) and
``resources`` (resource names, quantities) < ``objects`` (Pods and Nodes, typed) < ``shapes``
(their readers) < ``cards`` / ``declarations`` / ``annotations`` <
``demand`` < ``records`` < ``placement`` < ``claimbook`` / ``ledgersnapshot`` < ``ledger`` <
``verdict`` < ``policy`` / ``fragmentation`` <
``stranding`` / ``fgdsim`` < ``catalogue`` / ``availability`` / ``report`` / ``waste``.
Nothing here imports a Kubernetes client, a server, JupyterHub or gRPC (``.importlinter``
checks it).
"""

from .annotations import AllocationRecord, CardShare, ContainerShare
from .bounds import l1, l2
from .cards import Card, Node, declared_cards, model_matches, node_from_k8s, normalize_model
from .demand import Demand, demand_from_pod
from .errors import GPUShareError, InvalidObject, InvalidQuantity
from .fgdsim import SimulatorFGD
from .fragmentation import FragmentationGradient, Shape, Workload
from .ledger import Allocation, Ledger, OverCommit, Placement
from .names import ALLOCATION_ANNOTATION, CARDS_ANNOTATION
from .objects import Container, NodeObject, PodObject, pod_key
from .policy import POLICIES, Binpack, Placer, Policy, Refusal, Spread, make_policy
from .records import Ignored, IgnoredRecord, read_allocation
from .resources import DEFAULT_NAMES, ResourceNames, parse_units
from .shapes import read_node, read_pod
from .stranding import StrandAware, StrandedCapacity

__all__ = [
    "ALLOCATION_ANNOTATION",
    "CARDS_ANNOTATION",
    "DEFAULT_NAMES",
    "POLICIES",
    "Allocation",
    "AllocationRecord",
    "Binpack",
    "Card",
    "CardShare",
    "Container",
    "ContainerShare",
    "Demand",
    "FragmentationGradient",
    "GPUShareError",
    "Ignored",
    "IgnoredRecord",
    "InvalidObject",
    "InvalidQuantity",
    "Ledger",
    "Node",
    "NodeObject",
    "OverCommit",
    "Placement",
    "Placer",
    "PodObject",
    "Policy",
    "Refusal",
    "ResourceNames",
    "Shape",
    "SimulatorFGD",
    "Spread",
    "StrandAware",
    "StrandedCapacity",
    "Workload",
    "declared_cards",
    "demand_from_pod",
    "l1",
    "l2",
    "make_policy",
    "model_matches",
    "node_from_k8s",
    "normalize_model",
    "parse_units",
    "pod_key",
    "read_allocation",
    "read_node",
    "read_pod",
]
