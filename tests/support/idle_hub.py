"""A hub of a test's own whose gpushare service parks idle GPU slices (``idle_hub``), beside the
session's hub in its namespace (hub tier's test_idle_return, browser tier's test_idle_keep)."""

from __future__ import annotations

from typing import Any

from gpushare_hub.localcluster.hub import LocalHub
from tests.support.hub_session import NAMESPACE, SCHEDULER, SLICES, hub_spawner_config

SERVICE = "gpushare"
RETURN_AFTER, WARN_BEFORE = 40, 35  # seconds: warned from 5 s idle, parked at 40 s


def idle_hub(cluster: Any, return_after: int = RETURN_AFTER, warn_before: int = WARN_BEFORE) -> LocalHub:
    """A hub of the test's own whose service parks slices idle ``return_after`` seconds on the GPU
    on the CPU-only profile ``cpu``, warning ``warn_before`` seconds ahead."""
    # The catalogue's slices, and one plain CPU-only profile (KubeSpawner merges a profile's dict
    # overrides into the defaults, so the session hub's default GPU limit is left out here).
    spawner = {**hub_spawner_config(), "slices": SLICES, "gpushare_scheduler_name": SCHEDULER}
    del spawner["extra_resource_limits"]
    spawner["profile_list"] = [
        {"display_name": "CPU only (where idle GPU servers are parked)", "slug": "cpu"}
    ]
    settings = {
        "gpu_idle_action": "park",
        "gpu_idle_park_profile": "cpu",
        "gpu_idle_after": 5,
        "gpu_idle_return_after": return_after,
        "gpu_idle_warn_before": warn_before,
        "gpu_idle_keep_seconds": 3600,
        "gpu_idle_check_seconds": 2,
        "state_db": str(cluster.workdir / "hub-idle" / "gpushare-service.sqlite"),
    }
    config = "\n".join(
        [
            "from gpushare_hub.service import configure_hub",
            *(f"c.GPUShareService.{k} = {v!r}" for k, v in settings.items()),
            f"configure_hub(c, name={SERVICE!r})",
        ]
    )
    return LocalHub(
        cluster,
        NAMESPACE,
        spawner,
        spawner_class="gpushare_hub.GPUShareSpawner",
        extra_config=config,
        name="hub-idle",
    ).start()
