"""The device plugin's settings, as traitlets (its command line and config file): where cards come
from, the kubelet's folders and resource names, isolation, the self-test and the usage loop.
``gpushare-device-plugin`` and ``gpushare-dra-plugin`` take them all (as ``GPUShareDevicePlugin.*``);
the device mode's are in :mod:`.devicemodeapp`."""

from __future__ import annotations

from traitlets import Bool, Enum, Float, Int, Unicode
from traitlets.config import Configurable

from gpushare_hub.core.cardmemory import CONTEXT_MIB
from gpushare_hub.isolation.usage import IDLE_MEMORY_MIB

from .response import HOOK_HOST_PATH, MPS_ROOT
from .settings import DEFAULT_DIR


class PluginOptions(Configurable):
    node_name = Unicode("", help="This node's name (from the downward API: spec.nodeName).").tag(config=True)
    backend = Enum(
        ["nvml", "simulated"],
        default_value="nvml",
        help="Where cards come from: NVML, or the --simulate declaration.",
    ).tag(config=True)
    simulate = Unicode("", help="Declared cards for the simulated backend, e.g. '2x Tesla T4:15360'.").tag(
        config=True
    )
    health_file = Unicode("", help="Simulated backend: JSON file {uuid: false} marking cards unhealthy.").tag(
        config=True
    )
    plugin_dir = Unicode(DEFAULT_DIR, help="The kubelet's device-plugins folder (holds kubelet.sock).").tag(
        config=True
    )
    resource_name = Unicode("aliyun.com/gpu-mem", help="Extended resource counting GPU memory.").tag(
        config=True
    )
    count_resource_name = Unicode("aliyun.com/gpu-count", help="Node status resource: number of cards.").tag(
        config=True
    )
    unit = Enum(
        ["GiB", "MiB"],
        default_value="GiB",
        help="""Size of one unit. GiB keeps ListAndWatch small
        (a T4 is 15 devices); MiB would make a 80 GiB card 81920 devices.""",
    ).tag(config=True)
    reserve_fraction = Float(
        0.0,
        min=0.0,
        max=0.99,
        help="""Share of each card's memory kept back from pods, e.g. 0.05 for
        the driver and CUDA contexts (gpu-manager's deviceMemoryScaling).""",
    ).tag(config=True)
    kubeconfig = Unicode("", help="Kubeconfig file; empty means in-cluster.").tag(config=True)
    served_file = Unicode(
        "",
        help="""File that remembers which containers were served until their pod is marked
        ALIYUN_COM_GPU_MEM_ASSIGNED=true, so that a plugin restart in between cannot hand a
        served container's card to another. Default: gpushare-hub-served.json in plugin_dir.""",
    ).tag(config=True)
    node_config = Unicode(
        "",
        help="""ConfigMap NAMESPACE/NAME with per-node options: a JSON object under
        the node's name and/or 'default', e.g. {"reserveFraction": 0.05}. Read at start.""",
    ).tag(config=True)

    hook_host_path = Unicode(
        HOOK_HOST_PATH,
        help="""Host folder the plugin installs the Python start-up hook into at start; Allocate
        mounts it read-only into each GPU container at /opt/gpushare-hub/pyhook and sets
        PYTHONPATH to it, so that PyTorch is capped in every kernel, terminal and script.
        The DaemonSet must mount this folder (hostPath) at the same path. Empty: no hook.""",
    ).tag(config=True)
    mps = Bool(
        False,
        help="""Hard caps through NVIDIA MPS on this node: Allocate adds the card's MPS pipe and
        shared memory and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for the slice. Needs the MPS
        control daemon (one per card) running under --mps-root. Per node: 'mps' in --node-config.""",
    ).tag(config=True)
    mps_multi_user = Bool(
        False,
        help="""The MPS daemons on this node run multi-user (nvidia-cuda-mps-control -d -M, Volta
        or newer), so pods of different UIDs share a card. Per node: 'mpsMultiUser'.""",
    ).tag(config=True)
    mps_root = Unicode(
        MPS_ROOT,
        help="Host folder of the MPS daemons: <root>/<card UUID>/pipe and <root>/<card UUID>/shm.",
    ).tag(config=True)
    cdi = Bool(
        False,
        help="""The older spelling of --device-mode cdi (kept for existing installs): true is
        --device-mode cdi. Per node: 'cdi' in --node-config (false there means legacy).""",
    ).tag(config=True)
    compute_share = Bool(
        True,
        help="""On MPS nodes, give each container its slice's compute share: the percentage of the
        card's SMs its CUDA work may use (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), in proportion to its
        memory, or smaller where the catalogue says so (the pod's gpushare-hub.io/compute-share).
        False: containers on the card take turns on all its SMs (time-sliced). Per node:
        'computeShare' in --node-config.""",
    ).tag(config=True)
    tensorflow_memory_limit = Bool(
        False,
        help="""The start-up hook also sets TensorFlow's memory_limit to the slice. Off by default:
        TensorFlow then refuses set_memory_growth, which many notebooks call.
        Per node: 'tensorflowMemoryLimit' in --node-config.""",
    ).tag(config=True)

    isolation_tier = Enum(
        ["auto", "cooperative", "mps", "driver"],
        default_value="auto",
        help="""The tier of GPU-memory isolation this node enforces, published on the Node
        (gpushare-hub.io/isolation) for slices that require one: 'cooperative' (the start-up hook
        and the frameworks' environment caps), 'mps' (needs --mps), or 'driver' (the NVIDIA
        container toolkit's apply-cuda-memory-limits hook applies NVIDIA_GPU_MEMORY_LIMITS, which
        Allocate sets only on such nodes; driver r615+ and cgroup v2). 'auto': mps where --mps is on, else
        cooperative. The self-test checks the claim. Per node: 'isolationTier' in --node-config.""",
    ).tag(config=True)

    selftest = Bool(
        True,
        help="""Check the claimed isolation tier once after start: run the self-test
        (python -m gpushare_hub.isolation.selftest) with a one-unit slice of the first card and
        publish the result on the Node (gpushare-hub.io/isolation-check), with a Warning event
        when it observed a weaker tier. Nothing is published when no framework could be tried.""",
    ).tag(config=True)
    selftest_python = Unicode(
        "",
        help="""The Python the self-test runs with (it needs PyTorch, CuPy or JAX with CUDA to try
        anything; the plugin's image has none). Empty: this plugin's own Python.""",
    ).tag(config=True)

    selftest_path = Unicode(
        "",
        help="""Folders (':'-separated) put on the self-test's PYTHONPATH after the start-up hook,
        where its frameworks are installed apart from the plugin's Python (the simulated nodes
        of the demo and the tests put a fake torch there).""",
    ).tag(config=True)

    usage_interval = Float(
        15.0,
        help="""Seconds between readings of each card's processes (NVML; the plugin needs hostPID
        to map them to pods through their cgroups). Published on the Node as
        gpushare-hub.io/usage, as Prometheus metrics on --metrics-port, and as one Warning
        event per pod over its slice. 0: off.""",
    ).tag(config=True)
    idle_memory_mib = Int(
        IDLE_MEMORY_MIB,
        min=0,
        help="""A pod whose processes hold no more than this many MiB on a card and do no work at
        all (NVML's per-process SM utilisation 0) is idle on the GPU; the Node's usage annotation
        says since when (idleSince), and the hub service flags it. The default sits above an idle
        PyTorch, CuPy or JAX CUDA context (about 0.5-0.6 GiB), so a kernel that merely imported a
        framework is idle and one holding tensors is not.""",
    ).tag(config=True)
    usage_file = Unicode(
        "",
        help="""Simulated backend: JSON list of processes on the cards, e.g.
        [{"card": "<uuid>", "pod": "<pod UID>", "mib": 6963, "util": 40}], read at every usage
        reading.""",
    ).tag(config=True)
    usage_claims_dir = Unicode(
        "",
        help="""Simulated backend: folder where local processes claim the GPU memory they hold, one
        file each, <pid>.json = {"card": "<uuid>", "pod": "<pod UID>", "mib": 3072, "util": 0} (the demo's
        fake torch writes them). Read at every usage reading and added to --usage-file's; claims
        of processes that are gone are ignored.""",
    ).tag(config=True)
    overcommit = Float(
        1.0,
        help="""Overcommit (hibernation, device-plugin path only): how many times its memory a card's
        slices may hold together, awake or hibernated, from 1 (off) to 4. Above 1 the kubelet is
        offered that many times each card's units, the extender is told each card holds its memory
        plus the hibernated slices counted on it (never more than factor x), and a notebook's
        idle kernels, checkpointed into host memory by its Jupyter extension, make room for
        others: the plugin grants each wake, in the order asked, only while the card's awake
        slices fit its memory. Needs --hibernation-host-memory-gib and the usage loop.
        Per node: 'overcommit' in --node-config.""",
    ).tag(config=True)
    hibernation_host_memory_gib = Int(
        0,
        help="""Overcommit: the GiB of host memory set aside on this node for hibernated copies
        (required above 0 when --overcommit is above 1). The hibernated slices counted on the
        node never exceed it, so the extender never places on room that only they would make.
        Per node: 'hibernationHostMemoryGiB' in --node-config.""",
    ).tag(config=True)
    hibernation_min_idle = Int(
        300,
        help="""Overcommit: seconds a notebook must have run nothing (its own word) and done no GPU
        work (the plugin's measurement) before it is hibernated to let a neighbour wake; a
        notebook busy in the last this-many seconds is never hibernated for someone else.
        Per node: 'hibernationMinIdle' in --node-config.""",
    ).tag(config=True)
    context_mib = Int(
        CONTEXT_MIB,
        help="""MiB each GPU process of a slice keeps outside its framework's allocator (its CUDA
        context, modules, library workspaces): Allocate tells the start-up hook
        (GPUSHARE_CONTEXT_MIB), which counts it per process in the container ledger, so that every
        slice of a full card can hold what its caps allow (core/cardmemory.py). 560 covers the
        522 MiB measured for PyTorch on an H200; 0 to 8192, and below one unit of memory.
        Per node: 'contextMiB' in --node-config.""",
    ).tag(config=True)
    hibernation_dir = Unicode(
        "",
        help="""Overcommit: host folder of the pods' doors, <dir>/doors/<pod UID> (mounted read-write
        at /run/gpushare-hub/door: the notebook's ask.json) and <dir>/answers/<pod UID> (read-only
        at /run/gpushare-hub/answer: the plugin's answer.json). The DaemonSet must mount it at the
        same path. Empty: /var/lib/gpushare-hub/hibernation, or on the simulated backend with
        --usage-claims-dir, 'hibernation' beside that folder.""",
    ).tag(config=True)
    metrics_port = Int(
        0,
        min=0,
        max=65535,
        help="Port of the Prometheus /metrics endpoint (per-pod GPU memory used, slices); 0: none.",
    ).tag(config=True)
