"""Policies that place for a target workload (a mix of task shapes), built by name: the trace
replayer gives them the trace's own mix, the planner the hub history's. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from .fgdsim import SimulatorFGD
from .fragmentation import FragmentationGradient, Shape, Workload
from .policy import Policy, make_policy
from .stranding import StrandAware


def make_policy_for(name: str, shapes: Iterable[Shape]) -> Policy:
    """Policy ``name``; fgd, strand and fgd-sim with ``shapes`` as their target workload (the
    others take none). ValueError naming the policies for an unknown name."""
    if name == "fgd":
        return FragmentationGradient(Workload(shapes))
    if name == "strand":
        return StrandAware(list(shapes))
    if name == "fgd-sim":
        # The paper's simulator: its typical pods count the CPU-only pods too.
        return SimulatorFGD(shapes)
    return make_policy(name)
