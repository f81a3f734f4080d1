"""The session's hub and its notebook nodes (fixtures ``hub`` and ``notebook_nodes``), with the
settings they run with: one of each per pytest session, for every tier that asks (hub, browser,
fuzz). Registered once through ``pytest_plugins`` in ``tests/conftest.py``, so no tier imports
another tier's conftest for them (the cluster fixtures they use are in tests/conftest.py)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare_hub.localcluster.cluster import LocalCluster
from gpushare_hub.localcluster.hub import LocalHub
from gpushare_hub.localcluster.notebooknodes import NotebookNodes, spawner_config

NAMESPACE = "hub"
SCHEDULER = "gpushare-scheduler"


@pytest.fixture(scope="session")
def notebook_nodes(local_cluster: LocalCluster, gpushare: Any) -> NotebookNodes:
    """Two local notebook nodes (nb-1, nb-2), one 15 GiB Tesla T4 each, served by the node agent."""
    nodes = NotebookNodes(local_cluster)
    nodes.add(2, cards=1)
    nodes.start()
    return nodes


def hub_spawner_config() -> dict[str, Any]:
    """A plain KubeSpawner asking 5 GiB by default, 10 GiB with ``slice-10``; ``broken`` exits at once."""
    return {
        **spawner_config(slice_gib=5, scheduler=SCHEDULER),
        "profile_list": [
            {"display_name": "Tesla T4 · 5 GiB slice", "slug": "slice-5", "default": True},
            {
                "display_name": "Tesla T4 · 10 GiB slice",
                "slug": "slice-10",
                "kubespawner_override": {"extra_resource_limits": {"aliyun.com/gpu-mem": "10"}},
            },
            {
                "display_name": "A notebook command that fails at once",
                "slug": "broken",
                "kubespawner_override": {
                    "cmd": [
                        "python",
                        "-c",
                        "import sys; print('cannot read /etc/notebook.conf'); sys.exit(3)",
                    ],
                    "http_timeout": 30,  # the hub gives up on it soon
                },
            },
        ],
    }


# GPUShareSpawner's catalogue in the session's hub (the plain profiles above stay KubeSpawner's).
SLICES = [
    {"slug": "t4-5g", "display_name": "Tesla T4 · 5 GiB", "gib": 5, "models": ["Tesla-T4"]},
    # A smaller compute share than its memory's (47%): the form and Allocate on MPS nodes say 40%.
    {
        "slug": "t4-7g",
        "display_name": "Tesla T4 · 7 GiB",
        "gib": 7,
        "models": ["Tesla-T4"],
        "compute_share": 40,
    },
    {"slug": "any-16g", "display_name": "16 GiB of any card", "gib": 16},
]
QUOTA_GIB = 10

# The gpushare hub service (gpushare_hub.service.configure_hub) in the session's hub: SERVICE_ADMIN
# holds custom:gpushare:admin; the service "scraper" (token SCRAPER_TOKEN) may read only metrics.
SERVICE = "gpushare"
SERVICE_ADMIN = "gpu-admin"
SCRAPER_TOKEN = secrets.token_hex(32)
GPU_IDLE_AFTER = 20  # seconds
# GiB·h budgets: members of BUDGET_GROUP have none until an admin adds some (0 GiB·h a week);
# once spent, their GPU servers are stopped BUDGET_GRACE seconds after the warning.
BUDGET_GROUP = "gpu-budget"
BUDGET_USERS = ("budget-bob", "budget-cy")
BUDGET_GRACE = 5


def service_config() -> str:
    """The lines that add the service to the hub's config (after the spawner's)."""
    return "\n".join(
        [
            "from gpushare_hub.service import configure_hub",
            f"scraper = {{'name': 'scraper', 'api_token': {SCRAPER_TOKEN!r}}}",
            "c.JupyterHub.services = [*c.JupyterHub.services, scraper]",
            # The service's own settings pass through configure_hub; a slice with no GPU work
            # for 20 s is flagged idle (the dashboard test waits for that).
            f"c.GPUShareService.gpu_idle_after = {GPU_IDLE_AFTER}",
            # Estimates of a waiting spawn's wait from any history at all (600 s by default).
            "c.GPUShareService.queue_estimate_after = 0",
            # The idle rule and the GiB·h book look every 5 s (30 s by default).
            "c.GPUShareService.gpu_idle_check_seconds = 5",
            f"c.GPUShareService.budget_grace_seconds = {BUDGET_GRACE}",
            f"c.JupyterHub.load_groups = {{{BUDGET_GROUP!r}: {{'users': {list(BUDGET_USERS)!r}}}}}",
            f"configure_hub(c, name={SERVICE!r}, admin_users=[{SERVICE_ADMIN!r}], "
            "metrics_services=['scraper'])",
        ]
    )


@pytest.fixture(scope="session")
def hub(local_cluster: LocalCluster, gpushare: Any, notebook_nodes: NotebookNodes) -> Iterator[LocalHub]:
    """The hub runs GPUShareSpawner: its catalogue beside the plain KubeSpawner profiles."""
    local_cluster.create_namespace(NAMESPACE)
    config = {
        **hub_spawner_config(),
        "slices": SLICES,
        "quota_gib_per_user": QUOTA_GIB,
        "quota_gib_hours_per_group": {BUDGET_GROUP: 0.0},
        "gpushare_scheduler_name": SCHEDULER,
        "queue_estimate_after": 0,
    }
    h = LocalHub(
        local_cluster,
        NAMESPACE,
        config,
        spawner_class="gpushare_hub.GPUShareSpawner",
        extra_config="c.JupyterHub.allow_named_servers = True\n" + service_config(),
    ).start()
    yield h
