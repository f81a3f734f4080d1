"""Every name gpushare-hub writes or reads on Kubernetes objects: annotations, labels, event reasons.

One module, so that a name is spelled once and a reader can see the whole wire vocabulary. The
extended resources themselves (``aliyun.com/gpu-mem``, ``aliyun.com/gpu-count``) are
configurable: see :class:`~gpushare_hub.core.resources.ResourceNames`.
"""

from __future__ import annotations

PREFIX = "gpushare-hub.io"

# --- On pods -------------------------------------------------------------------------------
# Written by the extender at bind: the JSON allocation record (node, card UUIDs and units, and
# per container its card), which is what gpushare-hub trusts.
ALLOCATION_ANNOTATION = f"{PREFIX}/allocation"
# Aliyun gpushare's annotations, written beside ours at bind for old tooling: card index, pod
# total, card total, "false" until the device plugin allocates (then "true"), Unix ns of the bind.
GPU_MEM_PREFIX = "ALIYUN_COM_GPU_MEM_"
GPU_MEM_IDX = f"{GPU_MEM_PREFIX}IDX"
GPU_MEM_POD = f"{GPU_MEM_PREFIX}POD"
GPU_MEM_DEV = f"{GPU_MEM_PREFIX}DEV"
GPU_MEM_ASSIGNED = f"{GPU_MEM_PREFIX}ASSIGNED"
GPU_MEM_ASSUME_TIME = f"{GPU_MEM_PREFIX}ASSUME_TIME"
# Written by users (or the spawner): the placement policy, and card models to use or avoid.
POLICY_ANNOTATION = f"{PREFIX}/policy"
MODELS_ANNOTATION = f"{PREFIX}/card-models"
EXCLUDE_MODELS_ANNOTATION = f"{PREFIX}/exclude-card-models"
# Written by users (or the spawner, from the catalogue's ``isolation``): the isolation tier the
# pod requires (see isolation.py). On nodes the same name holds the tier the node enforces.
ISOLATION_ANNOTATION = f"{PREFIX}/isolation"
# TKEStack's spelling of the same two wishes, read for pods written for it.
TKESTACK_USE = "nvidia.com/use-gputype"
TKESTACK_NOUSE = "nvidia.com/nouse-gputype"
# Written by GPUShareSpawner: the catalogue slug of the slice (annotation and label).
SLICE_ANNOTATION = f"{PREFIX}/slice"
SLICE_LABEL = SLICE_ANNOTATION
# Written by GPUShareSpawner (or users, on their own pods): a smaller compute share than the slice's
# memory's, in percent of the card's SMs; the device plugin gives it on MPS nodes (computeshare.py).
COMPUTE_SHARE_ANNOTATION = f"{PREFIX}/compute-share"
# Written by KubeSpawner: whose server the pod is (believed only in the hub's own namespaces).
HUB_USER_ANNOTATION = "hub.jupyter.org/username"
HUB_SERVER_ANNOTATION = "hub.jupyter.org/servername"
# Written by the device plugin: the GPU memory the pod's processes use, as NVML sees it.
USAGE_ANNOTATION = f"{PREFIX}/usage"

# --- On nodes ------------------------------------------------------------------------------
# Written by the device plugin: the card inventory (UUID, index, model, MiB, units, health).
CARDS_ANNOTATION = f"{PREFIX}/cards"
# Written by our device plugin: it serves this node and marks pods ALIYUN_COM_GPU_MEM_ASSIGNED=true.
ALLOCATOR_ANNOTATION = f"{PREFIX}/allocator"
# Written by the device plugin: the cards' model, for node selectors.
MODEL_LABEL = f"{PREFIX}/card-model"
# Set by the admin (chart values): the node runs NVIDIA MPS, and for one user or several.
MPS_LABEL = f"{PREFIX}/mps"
MPS_MULTI_USER_LABEL = f"{PREFIX}/mps-multi-user"
# Written by the device plugin: the tier of memory isolation the node enforces (ISOLATION_ANNOTATION,
# above) and the result of its self-test of that tier.
ISOLATION_CHECK_ANNOTATION = f"{PREFIX}/isolation-check"
# Written by the device plugin on an MPS node: the MPS servers running and their users.
MPS_SERVERS_ANNOTATION = f"{PREFIX}/mps-servers"
# Written by the device plugin: how this node hands a card to a container, "cdi" (CDI devices of
# the plugin's own spec, applied by the runtime) or "legacy" (NVIDIA_VISIBLE_DEVICES, read by the
# NVIDIA runtime as containerd's default runtime).
DEVICE_MODE_ANNOTATION = f"{PREFIX}/device-mode"
# Written by the device plugin on a node with an overcommit factor above 1 (core/overcommit.py):
# the factor, the host memory set aside, each card's real/awake/hibernated MiB, each pod's state
# (awake or hibernated, since, card, MiB) and each card's line of pods waiting to wake. Read back
# by the plugin at its start.
HIBERNATION_ANNOTATION = f"{PREFIX}/hibernation"
# Written by the device plugin: whether its driver can hibernate kernels (CUDA's process
# checkpoint), "yes" or "no: <why>" (core/checkpointing.py); the idle action "auto" follows it.
CHECKPOINT_ANNOTATION = f"{PREFIX}/checkpoint"

# --- In CDI specs --------------------------------------------------------------------------
# The device plugin's own CDI spec (in /var/run/cdi): kind gpushare-hub.io/gpu, one device per
# card named by its UUID, e.g. gpushare-hub.io/gpu=GPU-8f6c...; no other component writes it.
CDI_KIND = f"{PREFIX}/gpu"

# --- Dynamic Resource Allocation (docs/dra.md) ---------------------------------------------------
# The DRA path beside the device plugin's: our kubelet plugin (gpushare-dra-plugin) publishes one
# ResourceSlice per node (pool = the node's name) whose devices are the node's cards, each with
# allowMultipleAllocations and a consumable "memory" capacity in bytes; a notebook's ResourceClaim
# (from the chart's template of its catalogue slice) asks a share of it, and the default scheduler
# allocates it. Wire names, spelt once here.
DRA_DRIVER = PREFIX  # spec.driver of our ResourceSlices and DeviceClass, the kubelet plugin's name
DRA_DEVICE_CLASS = f"gpu-slice.{PREFIX}"  # the DeviceClass our claim templates name
DRA_CAPACITY = "memory"  # each card's consumable capacity, in bytes (unprefixed, as 1.38 wants it)
DRA_DEVICE_PREFIX = "gpu-"  # a card's device name: gpu-<index>
DRA_ATTR_UUID = "uuid"
DRA_ATTR_MODEL = "model"  # normalised (Tesla-T4), as the catalogue's models name it
DRA_ATTR_INDEX = "index"
DRA_ATTR_ISOLATION = "isolation"  # the tier the node claims
DRA_REQUEST = "gpu"  # the request's name in our claim templates
DRA_POD_CLAIM = "gpushare-gpu"  # the pod's spec.resourceClaims[].name (and the container's claims[])
DRA_TEMPLATE_PREFIX = "gpushare-slice-"  # a catalogue slice's ResourceClaimTemplate: <prefix><slug>
# Prepare's per-claim CDI devices (a file per claim in the CDI folder, removed by Unprepare):
# gpushare-hub.io/claim=<claim UID>-gpu-<index>, carrying the slice's env and mounts; the card's
# own device nodes come from the plugin's card spec (CDI_KIND).
DRA_CLAIM_CDI_KIND = f"{PREFIX}/claim"
# The DRA packing (dra.scheduler: gpushare): our dedicated scheduler's second profile, for DRA pods,
# and the extender's prioritize-only verb it calls (binpack's node score from the claim's template;
# the scheduler keeps the allocation and the bind).
DRA_SCHEDULER_NAME = "gpushare-dra-scheduler"
DRA_PRIORITIZE_VERB = "dra-prioritize"

# --- In notebook containers -----------------------------------------------------------------
# Set by GPUShareSpawner: where the server reaches the hub service (its api/v1/me). The start-up
# hook, which may import nothing of ours, spells it again (a unit test keeps them equal).
SERVICE_URL_ENV = "GPUSHARE_SERVICE_URL"
# A server the hub service parked on a CPU-only profile: which slice went back, as JSON
# ({"slice", "units", "idle_seconds"}), so that JupyterLab's status bar can say so.
RETURNED_ENV = "GPUSHARE_RETURNED"
# Set by the device plugin's Allocate: the container's cards by UUID, in both device modes (in CDI
# mode NVIDIA_VISIBLE_DEVICES is "void", so that the NVIDIA runtime adds no card of its own).
# The start-up hook and the self-test spell it again.
CARD_UUIDS_ENV = "GPUSHARE_CARD_UUIDS"
# Set by Allocate: the container's ledger folder, where the start-up hook's processes say what each
# holds, so that the slice holds for all of them together: a folder of the container's own /tmp
# (/dev/shm is the pod's, and on MPS nodes every container's on the card).
# The hook spells it again.
LEDGER_DIR_ENV = "GPUSHARE_LEDGER_DIR"
# On nodes that overcommit their cards (the device plugin's overcommit): the folders Allocate mounts
# for a notebook server's door to the plugin (its ask, read-write) and the plugin's answer
# (read-only): wakes granted by the plugin, which measures the card (gpushare_hub/notebook/door.py).
DOOR_DIR_ENV = "GPUSHARE_DOOR_DIR"
ANSWER_DIR_ENV = "GPUSHARE_ANSWER_DIR"
# A simulated node (the demo and the tests): the folder of the fake GPU framework's claims, shared
# by the node's processes (gpushare_hub/demo/fakegpu), where hibernation's simulated driver works.
SIM_USAGE_DIR_ENV = "GPUSHARE_SIM_USAGE_DIR"
CONTAINER_LEDGER_DIR = "/tmp/gpushare-hub-ledger"
# Set by Allocate on a node with an overcommit factor above 1: the container's door to the device
# plugin (read-write; the notebook writes ask.json there) and the plugin's answers (read-only;
# answer.json), two host folders of the plugin's mounted at these paths (core/overcommit.py).
DOOR_DIR_ENV = "GPUSHARE_DOOR_DIR"
ANSWER_DIR_ENV = "GPUSHARE_ANSWER_DIR"
DOOR_CONTAINER_PATH = "/run/gpushare-hub/door"
ANSWER_CONTAINER_PATH = "/run/gpushare-hub/answer"

# --- On events -----------------------------------------------------------------------------
# The card an event is about (the device plugin's Warnings).
EVENT_CARD_ANNOTATION = f"{PREFIX}/card"
# Reasons of the Warning events we write.
BYPASS_REASON = "GPUShareNotScheduled"  # a GPU pod that did not name the dedicated scheduler
IGNORED_REASON = "GPUShareAllocationIgnored"  # an allocation record the ledger refused to count
OVER_SLICE_REASON = "GPUShareOverSlice"  # a pod's processes use more GPU memory than its slice
ISOLATION_CHECK_REASON = "GPUShareIsolationCheckFailed"  # the node's self-test saw a weaker tier
MPS_MISMATCH_REASON = "GPUShareMPSUserMismatch"  # an MPS server runs as another user than the pod
NODE_UNREADABLE_REASON = "GPUShareNodeUnreadable"  # a Node's card inventory cannot be read
DEVICE_MODE_REASON = "GPUShareDeviceModeUnavailable"  # the node can hand out cards in no device mode
NODE_CONFIG_REASON = "GPUShareNodeConfigInvalid"  # the node's options in the plugin's ConfigMap are wrong
WOKE_UNASKED_REASON = "GPUShareWokeWithoutGrant"  # a hibernated pod used the GPU before its wake's grant
# Reasons of the hub service's events on a user's GPU pods (Normal, or Warning before an action).
IDLE_WARNING_REASON = "GPUShareIdleWarning"  # idle on the GPU: the slice will be returned
IDLE_NOTIFIED_REASON = "GPUShareIdle"  # idle on the GPU (the rule only tells)
IDLE_RETURNED_REASON = "GPUShareIdleReturned"  # returned for being idle on the GPU
BUDGET_SPENT_REASON = "GPUShareBudgetSpent"  # the user's GiB-hour budget is spent
BUDGET_RETURNED_REASON = "GPUShareBudgetReturned"  # returned for a spent budget
OVER_SLICE_WARNING_REASON = "GPUShareOverSliceWarning"  # stayed over its slice: it will be stopped
OVER_SLICE_NOTIFIED_REASON = "GPUShareOverSliceNotified"  # stayed over its slice (the rule only tells)
OVER_SLICE_STOPPED_REASON = "GPUShareOverSliceStopped"  # stopped for staying over its slice
