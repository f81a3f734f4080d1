"""The idle culler of ``examples/jupyterhub_config.py``, as written, in a real hub: the real
jupyterhub-idle-culler starts with the example's flags, loads ``examples/idle_culler_config.py``
and culls an idle GPU slice (its pod deleted, its card's slice free again) while the example's
``--timeout=3600`` would still have kept it: only the config file's hook culls that soon.

The test adds to the example's service entry only ``--cull-every`` (the culler looks every 10
minutes by default) and ``GPU_IDLE_LIMIT`` in its environment (20 minutes in the file).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from traitlets.config import Config

from gpushare_hub.localcluster.hub import LocalHub
from tests.conftest import wait_for
from tests.support.hub_helpers import NAMESPACE, SCHEDULER, SLICES, hub_spawner_config, pod_of

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GPU_IDLE_LIMIT = 10  # seconds
USER = "cully"


def example_culler() -> tuple[dict[str, Any], dict[str, Any]]:
    """The example's idle-culler service entry and role, as JupyterHub reads them."""
    c = Config()
    path = EXAMPLES / "jupyterhub_config.py"
    exec(compile(path.read_text(), str(path), "exec"), {"get_config": lambda: c, "__file__": str(path)})
    [service] = [s for s in c.JupyterHub.services if s["name"] == "idle-culler"]
    [role] = [r for r in c.JupyterHub.load_roles if r["name"] == "idle-culler"]
    return service, role


def test_the_examples_idle_culler_starts_and_culls_an_idle_gpu_slice_sooner(
    local_cluster, hub, notebook_nodes
):
    del hub  # the session's hub made the namespace; this test runs a hub of its own beside it
    service, role = example_culler()
    assert service["command"][:3] == [sys.executable, "-m", "jupyterhub_idle_culler"], service
    assert "--timeout=3600" in service["command"]
    service = {
        **service,
        "command": [*service["command"], "--cull-every=3"],
        "environment": {"GPU_IDLE_LIMIT": str(GPU_IDLE_LIMIT)},
    }
    culler = LocalHub(
        local_cluster,
        NAMESPACE,
        {**hub_spawner_config(), "slices": SLICES, "gpushare_scheduler_name": SCHEDULER},
        spawner_class="gpushare_hub.GPUShareSpawner",
        extra_config=(
            f"c.JupyterHub.services = [*c.JupyterHub.services, {service!r}]\n"
            f"c.JupyterHub.load_roles = [*c.JupyterHub.load_roles, {role!r}]\n"
        ),
        name="hub-culler",
    ).start()
    try:
        culler.user_token(USER)  # makes the user
        status, body = culler.api("POST", f"/users/{USER}/server", {"profile": "t4-5g"})
        assert status in (201, 202), (status, body)
        culler.wait_ready(USER)
        pod = pod_of(local_cluster, USER)
        assert pod is not None and pod["metadata"]["annotations"].get("gpushare-hub.io/slice") == "t4-5g"

        # Nobody uses the server: the culler stops it within two minutes, where --timeout alone
        # would keep it an hour: only the config file's hook culls that soon.
        assert wait_for(lambda: not culler.api("GET", f"/users/{USER}")[1]["servers"], timeout=120), (
            "the idle culler never stopped the idle GPU server; the hub's log:\n"
            + culler.hub_log.read_text()[-4000:]
        )
        assert wait_for(lambda: pod_of(local_cluster, USER) is None, timeout=120), "the slice's pod stayed"
        log = culler.hub_log.read_text()
        assert "unrecognized arguments" not in log, log[-4000:]
        assert f"Culling server {USER} (inactive for" in log, log[-4000:]
    finally:
        if culler.api("GET", f"/users/{USER}")[1].get("servers"):
            culler.api("DELETE", f"/users/{USER}/server")
            wait_for(lambda: pod_of(local_cluster, USER) is None, timeout=120)
        culler.stop()
