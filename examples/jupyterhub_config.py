# JupyterHub configuration offering slices of Tesla T4 cards (15 GiB each) with GPUShareSpawner.
#
# Run the hub with:   jupyterhub -f jupyterhub_config.py
# The cluster needs the gpushare scheduler, extender and device plugin (see README.md).
import sys
from pathlib import Path

from gpushare_hub import GPUShareSpawner
from gpushare_hub.service import configure_hub

c = get_config()  # noqa: F821  (JupyterHub provides get_config when it loads this file)

c.JupyterHub.spawner_class = GPUShareSpawner

# --- The catalogue ------------------------------------------------------------------------
# One entry per choice on the spawn page. "slug" is what a REST request sends
# ({"profile": "t4-5g"}) and what the pod's gpushare-hub.io/slice annotation says.
# "gib" is GPU memory on one card; leave it out for whole cards. "models" are the card
# models the slice may run on (NVML's names with dashes for spaces). A slice larger than
# its model holds, an unknown model or a repeated slug stops the hub with the entry named.
c.GPUShareSpawner.slices = [
    {
        "slug": "t4-3g",
        "display_name": "Tesla T4 · 3 GiB",
        "gib": 3,
        "models": ["Tesla-T4"],
        "description": "Teaching notebooks and small models.",
        "default": True,
    },
    {
        "slug": "t4-5g",
        "display_name": "Tesla T4 · 5 GiB",
        "gib": 5,
        "models": ["Tesla-T4"],
        "description": "Fine-tuning small models.",
    },
    {
        "slug": "t4-7g",
        "display_name": "Tesla T4 · 7 GiB",
        "gib": 7,
        "models": ["Tesla-T4"],
        "description": "Half a card.",
    },
    {
        # No "gib": the whole card, for members of the "gpu-power-users" group only.
        "slug": "t4-whole",
        "display_name": "Tesla T4 · whole card",
        "cards": 1,
        "models": ["Tesla-T4"],
        "description": "All 15 GiB of one card.",
        "groups": ["gpu-power-users"],
    },
]
c.JupyterHub.load_groups = {"gpu-power-users": {"users": []}}

# To give a slice image or CPU/memory choices, write an ordinary KubeSpawner profile and
# attach the slice with "gpushare_slice"; that profile then replaces the slice on the form:
#
# c.GPUShareSpawner.profile_list = [
#     {"display_name": "PyTorch on 5 GiB", "gpushare_slice": "t4-5g",
#      "kubespawner_override": {"image": "quay.io/jupyter/pytorch-notebook:cuda12-latest"}},
# ]

# --- Limits ---------------------------------------------------------------------------------
# GiB one user may hold at once over all their servers (a whole card counts as 15 GiB);
# members of a listed group get that group's figure instead.
c.GPUShareSpawner.quota_gib_per_user = 7
c.GPUShareSpawner.quota_gib_per_group = {"gpu-power-users": 15}
c.JupyterHub.allow_named_servers = True
# GiB·h each user may hold per week (a 5 GiB slice held 8 h uses 40), busy or not; the spawn form
# shows what is used, a spawn with it spent is refused until Monday 00:00, and running GPU servers
# are warned, then stopped 15 min later (c.GPUShareService.budget_action). Admins add to a user's
# week on the dashboard. Counted by the service that configure_hub adds below.
c.GPUShareSpawner.quota_gib_hours = 200
c.GPUShareSpawner.quota_gib_hours_per_group = {"gpu-power-users": 600}
c.GPUShareSpawner.quota_gib_hours_window = "week"

# When no card has room for the chosen slice: "wait" (the pod queues and the progress page
# says why) or "refuse" (the spawn fails at once with the reason).
c.GPUShareSpawner.when_unavailable = "wait"

# --- Where GPU pods go ------------------------------------------------------------------
c.GPUShareSpawner.gpushare_scheduler_name = "gpushare-scheduler"
c.GPUShareSpawner.gpu_node_selector = {"gpushare": "true"}
c.GPUShareSpawner.gpu_tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

# --- Culling idle GPU servers sooner (examples/idle_culler_config.py) ----------------------
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [
            sys.executable,
            "-m",
            "jupyterhub_idle_culler",
            "--timeout=3600",
            # The culler's flag is --config (2.0 exits at once on --config-file); this file's folder.
            f"--config={Path(__file__).with_name('idle_culler_config.py')}",
        ],
    }
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        # admin:server_state lets the culler see which servers hold a GPU slice.
        "scopes": [
            "list:users",
            "read:users:activity",
            "read:servers",
            "delete:servers",
            "admin:server_state",
        ],
        "services": ["idle-culler"],
    }
]

# --- The "GPU slices" dashboard, JSON API and metrics (docs/reference/hub-service.md) ----------
# A hub-managed service at /services/gpushare/; its catalogue and node selector are the
# spawner's above. Members of "gpu-admins" see every user's slices; every user may read
# availability and their own slices. Call it after the spawner's settings and services.
c.JupyterHub.load_groups["gpu-admins"] = {"users": []}
# Slices idle on the GPU (no work, no more than an idle CUDA context held): users are warned in
# JupyterLab and may press Keep once; after 2 h the rule acts. "auto" (the default) hibernates
# idle kernels on nodes whose driver can (see below) and only tells elsewhere; "notify" only
# tells; "stop" stops the server; "park" restarts it on a CPU-only profile_list entry (home and
# image stay).
c.GPUShareService.gpu_idle_action = "auto"
c.GPUShareService.gpu_idle_return_after = 2 * 3600
c.GPUShareService.gpu_idle_exempt_groups = ["gpu-admins"]
# c.GPUShareService.gpu_idle_action = "park"
# c.GPUShareService.gpu_idle_park_profile = "cpu"  # a profile_list entry without a GPU
# "hibernate" keeps the server running: the notebook server's extension hibernates each kernel
# that ran nothing that long (its GPU memory copied into the pod's memory, the next cell restores
# it); gpu_hibernation gives slice pods the memory for those copies. "auto" does so where the
# node's device plugin says its driver can (gpushare-hub.io/checkpoint: a 570+ driver, x86-64, no
# MPS); "hibernate" everywhere.
c.GPUShareSpawner.gpu_hibernation = True
configure_hub(c, admin_groups=["gpu-admins"])

# Check the catalogue now, so that a mistake stops the hub at start with the entry named.
GPUShareSpawner.check_config(c)
