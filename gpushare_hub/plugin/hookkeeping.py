"""The start-up hook's files on the node: installed where Allocate's mount points before the
plugin serves, and removed on the way out when nothing on the node uses them any more."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.objects import PodObject
from gpushare_hub.core.reportfacts import may_hold_slice
from gpushare_hub.core.resources import ResourceNames

from .state import PluginState

if TYPE_CHECKING:  # the plugin's options, which GPUShareDevicePlugin has (a part, not a Configurable)
    from .options import PluginOptions as _Options
else:
    _Options = object


class HookKeeping(_Options):
    """The hook's files (a part of :class:`~.app.GPUShareDevicePlugin`)."""

    def install_hook(self) -> None:
        """Put the start-up hook where Allocate's mount points, or stop: a mount of a missing
        folder would fail every GPU container on this node."""
        from gpushare_hub.isolation.hookfiles import install_hook

        if not self.hook_host_path:
            return
        try:
            install_hook(Path(self.hook_host_path))
        except OSError as err:
            raise GPUShareError(
                f"cannot install the Python start-up hook into {self.hook_host_path} ({err}); mount "
                "that host folder into the plugin's container, or pass --hook-host-path='' to run "
                "without the PyTorch cap"
            ) from err

    def remove_hook_if_unused(self, state: PluginState) -> None:
        """On the way out, the start-up hook's files go when nothing on this node uses them: an
        uninstall then leaves none of our files on the node, while a restart or an upgrade with
        notebooks running keeps the files they mount.

        With ``hostPID`` (the chart's default) every container's mounts are read from /proc, which
        needs no API server: on an uninstall the plugin's RBAC may be gone before it stops. Without
        it, the pods of the node are asked for; kept when neither can tell."""
        from gpushare_hub.isolation.hookfiles import hook_mounted_elsewhere, remove_hook

        from .response import HOOK_CONTAINER_PATH

        log = logging.getLogger("gpushare.plugin")
        if not self.hook_host_path:
            return
        folder = Path(self.hook_host_path)
        mounted = hook_mounted_elsewhere(folder, HOOK_CONTAINER_PATH)
        if mounted:
            log.info("start-up hook kept in %s: a container on this node mounts it", folder)
            return
        if mounted is None:
            try:
                pods = state.pods.pods_on_node(self.node_name)
            except Exception as err:
                log.info("start-up hook kept in %s: cannot tell whether a pod uses it (%s)", folder, err)
                return
            users = [p for p in pods if holds_a_slice(p, state.settings.names)]
            if users:
                log.info("start-up hook kept in %s: %d pod(s) on this node hold a slice", folder, len(users))
                return
        remove_hook(folder)
        log.info("start-up hook removed from %s: nothing on this node uses it", folder)


def holds_a_slice(pod: PodObject, names: ResourceNames) -> bool:
    """A pod, not finished, that may hold or wait for a slice (the core's test: it names a GPU
    resource, carries an allocation record, or claims a slice on the DRA path, whose claim's
    CDI spec mounts the same hook)."""
    return pod.phase not in ("Succeeded", "Failed") and may_hold_slice(pod, names)
