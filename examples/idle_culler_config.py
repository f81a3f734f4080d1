# jupyterhub-idle-culler configuration: cull idle GPU servers sooner than CPU ones.
#
# Run the culler with --config-file=idle_culler_config.py (see examples/jupyterhub_config.py).
# GPUShareSpawner keeps the server's slice in its state ("gpushare_slice"); the culler sees
# server["state"] when its role has the admin:server_state scope.

from datetime import timedelta
from typing import Any

c = get_config()  # noqa: F821  (the culler provides get_config when it loads this file)

GPU_IDLE_LIMIT = 20 * 60  # seconds: a GPU server idle this long is culled


def cull_arbiter_hook(
    *, inactive: timedelta, inactive_limit: float, server: dict[str, Any], **kwargs: Any
) -> bool:
    """Cull a GPU server after GPU_IDLE_LIMIT (or the culler's --timeout, if shorter);
    any other server after --timeout, as the culler does by default."""
    state = server.get("state") or {}
    limit = min(inactive_limit, GPU_IDLE_LIMIT) if state.get("gpushare_slice") else inactive_limit
    return inactive.total_seconds() >= limit


c.IdleCuller.cull_arbiter_hook = cull_arbiter_hook
