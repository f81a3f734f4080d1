"""What the device plugin checks and settles before it serves: the API server and the node's
options from ``--node-config``, the overcommit, the isolation tier, the hibernation folder; and
:class:`CannotStart`, why it does not start, with the status it exits with."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.isolation import COOPERATIVE, MPS
from gpushare_hub.core.names import NODE_CONFIG_REASON
from gpushare_hub.core.overcommit import Overcommit, overcommit_problem
from gpushare_hub.kube.kubeconfig import connection_problem
from gpushare_hub.kube.rest import RestClient

from .nodeconfig import NodeConfigError
from .settings import Settings

if TYPE_CHECKING:  # the plugin's options, which GPUShareDevicePlugin has (a part, not a Configurable)
    from .devicemodeapp import DeviceModeOptions
    from .options import PluginOptions

    class _Options(DeviceModeOptions, PluginOptions): ...
else:
    _Options = object


UNIX_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path, 108 with its NUL)


class CannotStart(GPUShareError):
    """Why the plugin cannot start, printed once by :meth:`GPUShareDevicePlugin.start`, and the
    status it exits with."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class StartChecks(_Options):
    """The plugin's checks before it serves (a part of :class:`~.app.GPUShareDevicePlugin`)."""

    def connect(self) -> RestClient:
        """The API client, with the per-node options applied; :class:`CannotStart` if neither can be had."""
        from gpushare_hub.kube.execcred import CredentialError
        from gpushare_hub.kube.kubeconfig import KubeconfigError

        from .kube import rest_client

        problem = connection_problem(self.kubeconfig or None)
        if problem:
            raise CannotStart(problem, 2)
        where = f"--kubeconfig {self.kubeconfig}: " if self.kubeconfig else ""
        try:
            api = rest_client(self.kubeconfig or None)
            if self.node_config:
                self.apply_node_config(api)
        except (KubeconfigError, CredentialError) as err:
            raise CannotStart(f"{where}{err}", 2) from err
        except NodeConfigError as err:
            self.warn_node(api, NODE_CONFIG_REASON, err)
            raise CannotStart(str(err), 2) from err
        except GPUShareError as err:
            raise CannotStart(str(err), 2) from err
        return api

    def apply_node_config(self, api: RestClient) -> None:
        from gpushare_hub.kube.rest import ApiStatusError, Unreachable

        from .nodeconfig import options_for

        namespace, _, name = self.node_config.partition("/")
        if not name:
            raise NodeConfigError(f"--node-config {self.node_config!r}: write NAMESPACE/NAME")
        try:
            cm = api.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        except ApiStatusError as err:
            raise NodeConfigError(
                f"cannot read ConfigMap {self.node_config} ({err.status} {err.reason})"
            ) from err
        except Unreachable as err:
            raise NodeConfigError(f"cannot read ConfigMap {self.node_config}: {err}") from err
        opts = options_for(self.node_name, cm.get("data") or {}, f"ConfigMap {self.node_config}")
        if "reserveFraction" in opts:
            self.reserve_fraction = opts["reserveFraction"]
        self.mps = opts.get("mps", self.mps)
        self.mps_multi_user = opts.get("mpsMultiUser", self.mps_multi_user)
        self.device_mode = opts.get("deviceMode", self.device_mode)
        self.tensorflow_memory_limit = opts.get("tensorflowMemoryLimit", self.tensorflow_memory_limit)
        self.compute_share = opts.get("computeShare", self.compute_share)
        self.isolation_tier = opts.get("isolationTier", self.isolation_tier)
        self.overcommit = opts.get("overcommit", self.overcommit)
        self.hibernation_host_memory_gib = opts.get(
            "hibernationHostMemoryGiB", self.hibernation_host_memory_gib
        )
        self.hibernation_min_idle = opts.get("hibernationMinIdle", self.hibernation_min_idle)
        self.context_mib = opts.get("contextMiB", self.context_mib)

    def warn_node(self, api: RestClient, reason: str, err: Exception) -> None:
        """Why the plugin does not start, as a Warning event on the Node too, where an admin looks
        (``kubectl describe node``) while the plugin's pod restarts; best effort."""
        from .kube import KubeUsageSink

        try:
            KubeUsageSink(api, self.node_name).warn_node(reason, f"device plugin not started: {err}")
        except Exception as failed:  # the plugin stops with the message either way
            logging.getLogger("gpushare.plugin").warning("could not post the Warning event: %s", failed)

    def overcommit_settings(self) -> Overcommit:
        """The node's overcommit, checked: :class:`CannotStart` naming the node, the value and the fix."""
        problem = overcommit_problem(
            self.node_name,
            self.overcommit,
            self.hibernation_host_memory_gib,
            self.hibernation_min_idle,
            self.usage_interval,
        )
        if problem:
            raise CannotStart(problem, 2)
        return Overcommit(self.overcommit, self.hibernation_host_memory_gib * 1024, self.hibernation_min_idle)

    def socket_paths(self) -> None:
        """:class:`CannotStart` where the plugin's sockets in --plugin-dir would pass what a Unix
        socket's path may hold (gRPC only says it cannot bind, again and again)."""
        for name in (Settings.socket_name, Settings.count_socket_name):
            path = str(Path(self.plugin_dir) / name)
            if len(path.encode()) > UNIX_PATH_MAX:
                raise CannotStart(
                    f"--plugin-dir {self.plugin_dir[:200]}: the plugin's socket {name} there would have "
                    f"a path of {len(path.encode())} bytes, and a Unix socket's may have at most "
                    f"{UNIX_PATH_MAX}; give the kubelet's device-plugins folder "
                    "(/var/lib/kubelet/device-plugins) or a shorter one",
                    2,
                )

    def tier(self) -> str:
        """The tier this node claims; :class:`CannotStart` when the settings contradict it."""
        if self.isolation_tier == "auto":
            return MPS if self.mps else COOPERATIVE
        if self.isolation_tier == MPS and not self.mps:
            raise CannotStart(
                "--isolation-tier mps needs MPS on this node: pass --mps (or 'mps': true in "
                "--node-config) with the MPS control daemon running, or claim another tier",
                2,
            )
        return str(self.isolation_tier)

    def hibernation_folder(self) -> str:
        """The pods' doors: --hibernation-dir, else beside the simulated claims, else the default."""
        from .doors import DEFAULT_HIBERNATION_DIR

        if self.hibernation_dir:
            return str(self.hibernation_dir)
        if self.backend == "simulated" and self.usage_claims_dir:
            return str(Path(self.usage_claims_dir).parent / "hibernation")
        return DEFAULT_HIBERNATION_DIR
