"""What Allocate gives one container besides its card: the start-up hook, MPS and CDI (pure).

* **Start-up hook** (always, unless switched off): the host folder the plugin installed
  the hook into, mounted read-only, and ``PYTHONPATH`` pointing at it, so that every
  Python process of the container caps PyTorch (which reads no environment cap).
  The kubelet applies the plugin's variables first and the pod spec's after, so a
  ``PYTHONPATH`` in the pod spec wins over ours: a pod (or KubeSpawner's ``environment``)
  that sets its own must start it with :data:`HOOK_CONTAINER_PATH`. An image's
  ``ENV PYTHONPATH`` is replaced by ours; images that rely on one need the same.
* **MPS** (nodes where the admin enabled it): the card's MPS pipe folder and its shared
  memory, ``CUDA_MPS_PIPE_DIRECTORY``, and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for the
  slice (index 0: the container sees one card). MPS then reports the slice as the card's
  size, so fraction caps (JAX/XLA) are set near 1 instead of slice/card, which would cap
  twice; absolute caps (CuPy bytes, TensorFlow MiB) stay as they are. The hook leaves
  PyTorch to MPS.
* **Driver limit** (nodes that claim the ``driver`` tier only): ``NVIDIA_GPU_MEMORY_LIMITS`` and
  ``NVIDIA_GPU_MEMORY_REQUESTS``, the slice in MiB, which the NVIDIA container toolkit's
  ``apply-cuda-memory-limits`` CDI hook applies through NVML. That hook is not in a released
  toolkit (it is on NVIDIA's branch ``cuda-memory-limits``; v1.20.0, which GPU Operator v26.7
  ships, has none), and where it is, it fails the container's start when both variables are set
  on a node it cannot serve: cgroup v1 ("setting GPU memory limits is only supported in cgroup
  v2"), no ``libnvidia-ml.so.1``, NVML refusing the limit. So they are set only where the admin
  says the node enforces them (``isolationTier: driver``). ``GPUSHARE_ISOLATION_TIER`` names the
  tier the node claims (the self-test reads it).
* **Door** (nodes with an overcommit factor above 1): the pod's door and answer folders
  (:mod:`.doors`), ``GPUSHARE_DOOR_DIR`` and ``GPUSHARE_ANSWER_DIR``.
* **Device mode** (see :mod:`.devicemode`): in ``cdi`` mode the card is named as the CDI device
  ``gpushare-hub.io/gpu=<UUID>`` of the plugin's own spec, and ``NVIDIA_VISIBLE_DEVICES`` is
  ``void`` so that a container run by the NVIDIA runtime (a ``runtimeClassName: nvidia`` pod, or
  a node where it is the default) gets no card of its own from an image's ``all``; in ``legacy``
  mode ``NVIDIA_VISIBLE_DEVICES=<UUID>``. ``GPUSHARE_CARD_UUIDS`` names the cards in both.

Host layout on an MPS node, shared with the control-daemon DaemonSet (one daemon per card):
``<mps root>/<card UUID>/pipe`` (the daemon's ``CUDA_MPS_PIPE_DIRECTORY``) and
``<mps root>/<card UUID>/shm`` (its ``/dev/shm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gpushare_hub.core import cardmemory, computeshare
from gpushare_hub.core.cards import Card
from gpushare_hub.core.isolation import COOPERATIVE, DRIVER
from gpushare_hub.core.names import (
    ANSWER_CONTAINER_PATH,
    ANSWER_DIR_ENV,
    CARD_UUIDS_ENV,
    CDI_KIND,
    DOOR_CONTAINER_PATH,
    DOOR_DIR_ENV,
)
from gpushare_hub.isolation.selftest import DRIVER_VAR, TIER_VAR

from .matching import Waiting, container_env

HOOK_HOST_PATH = "/var/lib/gpushare-hub/pyhook"
HOOK_CONTAINER_PATH = "/opt/gpushare-hub/pyhook"
MPS_ROOT = "/run/gpushare-hub/mps"
MPS_PIPE_CONTAINER_PATH = "/run/gpushare-hub/mps/pipe"
VISIBLE_VAR = "NVIDIA_VISIBLE_DEVICES"
NO_CARD = "void"  # the NVIDIA runtime's word for "no card" (its CDI mode and legacy mode alike)
# Read by the NVIDIA container toolkit's memory-limit hook (MiB), where the node has it; the
# limit's name and the tier's are the self-test's (it reads them in the container).
DRIVER_LIMITS_VAR = DRIVER_VAR
DRIVER_REQUESTS_VAR = "NVIDIA_GPU_MEMORY_REQUESTS"
# Under MPS the total that JAX sees is the slice; leave XLA a little for cuDNN/cuBLAS
# workspaces that it does not allocate through its own pool.
MPS_XLA_FRACTION = "0.950"


@dataclass(frozen=True)
class Isolation:
    """A node's isolation settings (flags, then the per-node ConfigMap)."""

    hook_host_path: str = HOOK_HOST_PATH  # "" switches the hook off
    mps: bool = False
    mps_root: str = MPS_ROOT
    cdi: bool = False  # the node's device mode is cdi (else legacy)
    tensorflow_memory_limit: bool = False
    tier: str = COOPERATIVE  # the tier the node claims (published on the Node, told to containers)
    compute_share: bool = True  # on MPS nodes: each container's share of the SMs (computeshare.py)
    context_mib: int = cardmemory.CONTEXT_MIB  # each GPU process's CUDA context (core/cardmemory.py)


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True)
class ContainerResponse:
    """One container's part of an Allocate response (rendered to protobuf by the servicer)."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...] = ()
    cdi_devices: tuple[str, ...] = field(default=())


def container_response(w: Waiting, card: Card, mib_per_unit: int, iso: Isolation) -> ContainerResponse:
    env = container_env(w, card, mib_per_unit)
    limit_mib = w.units * mib_per_unit
    mounts: list[Mount] = []
    cdi: tuple[str, ...] = ()
    if iso.hook_host_path:
        mounts.append(Mount(HOOK_CONTAINER_PATH, iso.hook_host_path, read_only=True))
        env["PYTHONPATH"] = HOOK_CONTAINER_PATH
    if iso.tier == DRIVER:
        env[DRIVER_LIMITS_VAR] = str(limit_mib)
        env[DRIVER_REQUESTS_VAR] = str(limit_mib)
    env[TIER_VAR] = iso.tier
    # What of the slice its frameworks can hold (core/cardmemory.py): the card as CUDA gives it,
    # and each GPU process's context, which the start-up hook counts in the container ledger.
    if card.mib:
        env[cardmemory.CARD_CUDA_ENV] = str(cardmemory.cuda_mib(card.model, card.mib))
    env[cardmemory.CONTEXT_ENV] = str(iso.context_mib)
    if iso.tensorflow_memory_limit:
        env["GPUSHARE_TENSORFLOW_MEMORY_LIMIT"] = "true"
    if iso.mps:
        card_dir = f"{iso.mps_root.rstrip('/')}/{w.uuid}"
        mounts.append(Mount(MPS_PIPE_CONTAINER_PATH, f"{card_dir}/pipe", read_only=False))
        mounts.append(Mount("/dev/shm", f"{card_dir}/shm", read_only=False))
        env["CUDA_MPS_PIPE_DIRECTORY"] = MPS_PIPE_CONTAINER_PATH
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit_mib}M"
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = MPS_XLA_FRACTION
        if iso.compute_share:
            share = computeshare.from_annotation(w.compute_share, w.units, card.units)
            env[computeshare.MPS_PERCENTAGE_ENV] = str(share)
    if iso.cdi:
        cdi = cdi_names(w.cards or (w.uuid,))  # every card of a 2-card pod
        env[VISIBLE_VAR] = NO_CARD
    return ContainerResponse(envs=env, mounts=tuple(mounts), cdi_devices=cdi)


def with_door(response: ContainerResponse, door: str, answers: str) -> ContainerResponse:
    """On an overcommitted node: the pod's door (read-write) and answer folder (read-only), host
    folders of the plugin's, and their paths in the container (core/overcommit.py)."""
    mounts = (
        Mount(DOOR_CONTAINER_PATH, door, read_only=False),
        Mount(ANSWER_CONTAINER_PATH, answers, read_only=True),
    )
    envs = {**response.envs, DOOR_DIR_ENV: DOOR_CONTAINER_PATH, ANSWER_DIR_ENV: ANSWER_CONTAINER_PATH}
    return replace(response, envs=envs, mounts=response.mounts + mounts)


def cdi_names(cards: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{CDI_KIND}={u}" for u in cards)


def whole_card_response(w: Waiting, iso: Isolation) -> ContainerResponse:
    """A gpu-count Allocate: the container's whole cards. A container that also asks gpu-mem
    gets nothing here (its gpu-mem Allocate names the same cards with its caps; the kubelet
    merges both answers, and equal names never conflict)."""
    if not w.alone:
        return ContainerResponse(envs={})
    cards = w.cards or (w.uuid,)
    env = {CARD_UUIDS_ENV: ",".join(cards)}
    if iso.cdi:
        return ContainerResponse(envs={**env, VISIBLE_VAR: NO_CARD}, cdi_devices=cdi_names(cards))
    return ContainerResponse(envs={**env, VISIBLE_VAR: ",".join(cards)})
