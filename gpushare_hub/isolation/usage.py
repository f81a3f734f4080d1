"""Who really uses how much GPU memory: processes on the cards, mapped to pods (pure).

The device plugin reads each card's running processes (NVML on a real node, a declared
list on the simulated backend) with each process's cgroup, and this module turns them into
per-pod usage beside each pod's slice. A process belongs to the pod whose UID appears in
its cgroup path, in any of the kubelet's layouts::

    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_..._.slice/cri-containerd-<id>.scope
    11:memory:/kubepods/besteffort/pod1b2c3d4e-....-..../<container id>

Processes of no pod holding a slice here (the MPS server, host tools, a pod that bypassed
the scheduler) count towards their card's total only.

Published by the plugin on its Node as ``gpushare-hub.io/usage`` (:meth:`UsageReport.annotation`)::

    {"pods": [{"pod": "jhub/jupyter-ana", "uid": "...", "card": "GPU-...", "usedMiB": 6963,
               "sliceMiB": 5120, "smUtil": 37, "idleSince": null}],
     "cards": {"GPU-...": {"usedMiB": 7003}}}

``smUtil`` is the percent of the card's SMs the pod's processes kept busy since the plugin's
previous reading (null where the card does not sample processes). ``idleSince`` (Unix seconds)
is when the pod last stopped being *active* on the card, null while it is active or where
utilisation is not measured: active means its processes held more than the plugin's
``--idle-memory-mib`` or did any work at all (:func:`is_active`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpushare_hub.core.cards import Node
from gpushare_hub.core.ledger import Ledger
from gpushare_hub.core.objects import PodObject
from gpushare_hub.core.resources import DEFAULT_NAMES, ResourceNames

MPS_SERVER_COMMAND = "nvidia-cuda-mps-server"
# An idle framework's CUDA context holds about 520-610 MiB on an H200 (driver 580; PyTorch, CuPy,
# JAX; docs/measurements/2026-11-26-gpu-usage-h200.md): a pod holding no more than this and
# doing no work is an idle kernel (the plugin's --idle-memory-mib).
IDLE_MEMORY_MIB = 1024

_POD_IN_CGROUP = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?(?:/|$)"
)


@dataclass(frozen=True)
class GPUProcess:
    """A process holding memory on a card, as the backend saw it."""

    card: str  # UUID
    pid: int
    used_mib: int
    cgroup: str = ""  # the text of /proc/<pid>/cgroup
    uid: int | None = None  # the process's real UID
    command: str = ""  # the executable's base name
    # Percent of the card's streaming multiprocessors the process kept busy since the last
    # poll (NVML's per-process samples); None where the card does not say.
    sm_util: int | None = None


def pod_uid_of_cgroup(cgroup: str) -> str | None:
    """The pod UID in a process's cgroup file (v1 or v2, systemd or cgroupfs driver), or None."""
    for line in cgroup.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        m = _POD_IN_CGROUP.search(path)
        if m:
            return m.group(1).replace("_", "-")
    return None


def is_active(used_mib: int, sm_util: int | None, idle_memory_mib: int) -> bool | None:
    """Whether a pod is using its slice now: it holds more than ``idle_memory_mib`` (more than an
    idle framework's CUDA context) or its processes did any work since the last reading.
    None where utilisation is not measured: then nobody can say it is idle."""
    if sm_util is None:
        return None
    return used_mib > idle_memory_mib or sm_util > 0


@dataclass(frozen=True)
class PodUsage:
    pod: str  # namespace/name
    uid: str
    card: str
    used_mib: int
    slice_mib: int
    sm_util: int | None = None  # percent of the card's SMs, since the last reading
    idle_since: int | None = None  # Unix seconds; None while active or not measured

    @property
    def over(self) -> bool:
        return self.used_mib > self.slice_mib

    def warning(self, node: str) -> str:
        return (
            f"pod {self.pod} uses {self.used_mib / 1024:.1f} GiB of GPU memory on card {self.card} "
            f"(node {node}), more than its {self.slice_mib / 1024:g} GiB slice. Other notebooks on this "
            "card may run out of memory. Free memory (restart the kernel, or call "
            "torch.cuda.empty_cache()), or ask for a larger slice."
        )


@dataclass(frozen=True)
class UsageReport:
    pods: tuple[PodUsage, ...]
    card_used_mib: Mapping[str, int]  # every process on each card
    mps_servers: Mapping[str, int]  # card UUID -> UID its MPS server runs for

    def over(self) -> list[PodUsage]:
        return [p for p in self.pods if p.over]

    def differs(self, other: UsageReport | None, tolerance_mib: int, tolerance_util: int = 25) -> bool:
        """Worth a new write to the Node: pods, slices, over-slice or idle states or MPS servers
        changed, or some figure moved by ``tolerance_mib`` (or ``tolerance_util`` points of
        utilisation) or more: memory in use and utilisation jitter all the time."""
        if other is None or self.mps_servers != other.mps_servers:
            return True
        mine = {(p.uid, p.card): p for p in self.pods}
        theirs = {(p.uid, p.card): p for p in other.pods}
        if mine.keys() != theirs.keys() or set(self.card_used_mib) != set(other.card_used_mib):
            return True
        for k, p in mine.items():
            q = theirs[k]
            if (
                p.slice_mib != q.slice_mib
                or p.over != q.over
                or p.idle_since != q.idle_since
                or (p.sm_util is None) != (q.sm_util is None)
                or abs(p.used_mib - q.used_mib) >= tolerance_mib
                or abs((p.sm_util or 0) - (q.sm_util or 0)) >= tolerance_util
            ):
                return True
        return any(
            abs(mib - other.card_used_mib[c]) >= tolerance_mib for c, mib in self.card_used_mib.items()
        )

    def annotation(self) -> str:
        return json.dumps(
            {
                "pods": [
                    {
                        "pod": p.pod,
                        "uid": p.uid,
                        "card": p.card,
                        "usedMiB": p.used_mib,
                        "sliceMiB": p.slice_mib,
                        "smUtil": p.sm_util,
                        "idleSince": p.idle_since,
                    }
                    for p in self.pods
                ],
                "cards": {c: {"usedMiB": mib} for c, mib in sorted(self.card_used_mib.items())},
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    def mps_annotation(self) -> str:
        return json.dumps(dict(sorted(self.mps_servers.items())), separators=(",", ":"))


def slices_on_node(
    pods: Iterable[PodObject], node: Node, names: ResourceNames = DEFAULT_NAMES
) -> dict[str, tuple[str, dict[str, int]]]:
    """Pod UID -> (namespace/name, {card UUID: slice MiB}) for pods holding cards of ``node``.

    Records are read under the core's one rule (:mod:`gpushare_hub.core.records`), through
    the same ledger the extender and the plugin's matching use: a forged record counts for
    nothing here either.
    """
    ledger = Ledger(names)
    ledger.set_node(node)
    for pod in pods:
        ledger.observe_pod(pod)
    out: dict[str, tuple[str, dict[str, int]]] = {}
    for alloc in ledger.allocations():
        if alloc.node != node.name:
            continue
        cards: dict[str, int] = {}
        for share in alloc.cards:
            cards[share.uuid] = cards.get(share.uuid, 0) + share.units * names.mib_per_unit
        out[alloc.uid] = (alloc.key, cards)
    return out


def usage_report(
    processes: Iterable[GPUProcess],
    pods: Iterable[PodObject],
    node: Node,
    names: ResourceNames = DEFAULT_NAMES,
    unsampled: Iterable[str] = (),
    claimed: Mapping[str, tuple[str, dict[str, int]]] | None = None,
) -> UsageReport:
    """Per pod and card: memory its processes hold and their SM utilisation (summed over its
    processes, at most 100). ``unsampled``: cards whose utilisation the backend cannot read;
    their pods' ``sm_util`` is None. A pod with no process on a sampled card did no work (0).
    ``claimed``: the slices of pods that hold theirs through DRA claims the node's plugin prepared
    (pod UID -> (namespace/name, {card UUID: MiB})), beside those of the pods' annotations."""
    slices = {**slices_on_node(pods, node, names), **(claimed or {})}
    unsampled = set(unsampled)
    card_used: dict[str, int] = {}
    used: dict[tuple[str, str], int] = {}
    util: dict[tuple[str, str], int | None] = {}
    mps: dict[str, int] = {}
    for p in processes:
        card_used[p.card] = card_used.get(p.card, 0) + p.used_mib
        if p.command == MPS_SERVER_COMMAND:
            if p.uid is not None:
                mps[p.card] = p.uid
            continue
        uid = pod_uid_of_cgroup(p.cgroup)
        if uid is not None and uid in slices:
            k = (uid, p.card)
            used[k] = used.get(k, 0) + p.used_mib
            before = util.get(k, 0)
            util[k] = None if p.sm_util is None or before is None else min(100, before + p.sm_util)
    rows = []
    for uid, (key, cards) in sorted(slices.items(), key=lambda kv: kv[1][0]):
        for card in sorted(set(cards) | {c for (u, c) in used if u == uid}):
            busy = None if card in unsampled else util.get((uid, card), 0)
            rows.append(PodUsage(key, uid, card, used.get((uid, card), 0), cards.get(card, 0), busy))
    return UsageReport(tuple(rows), card_used, mps)
