# jupyterhub-idle-culler configuration: cull idle GPU servers sooner than CPU ones.
#
# Run the culler with --config=idle_culler_config.py (see examples/jupyterhub_config.py; the
# culler has no --config-file flag and exits at once with one).
# GPUShareSpawner keeps the server's slice in its state ("gpushare_slice"); the culler sees
# server["state"] when its role has the admin:server_state scope.

import os
from datetime import timedelta
from typing import Any

c = get_config()  # noqa: F821  (the culler provides get_config when it loads this file)

# Seconds: a GPU server idle this long is culled ($GPU_IDLE_LIMIT in the culler's environment,
# e.g. the service's "environment", overrides it).
GPU_IDLE_LIMIT = int(os.environ.get("GPU_IDLE_LIMIT", 20 * 60))


def cull_arbiter_hook(
    *, inactive: timedelta, inactive_limit: float, server: dict[str, Any], **kwargs: Any
) -> bool:
    """Cull a GPU server after GPU_IDLE_LIMIT (or the culler's --timeout, if shorter);
    any other server after --timeout, as the culler does by default."""
    state = server.get("state") or {}
    limit = min(inactive_limit, GPU_IDLE_LIMIT) if state.get("gpushare_slice") else inactive_limit
    return inactive.total_seconds() >= limit


c.IdleCuller.cull_arbiter_hook = cull_arbiter_hook
