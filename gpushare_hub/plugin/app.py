"""``gpushare-device-plugin``: the kubelet device plugin of gpushare-hub.

On a GPU node (NVML)::

    gpushare-device-plugin --node-name $NODE_NAME

For tests and the demo, declared cards go through the same code::

    gpushare-device-plugin --backend simulated --simulate "2x Tesla T4:15360" --node-name gpu-1 \\
        --kubeconfig kc --plugin-dir /tmp/dp
"""

from __future__ import annotations

import logging
import platform
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from traitlets import default
from traitlets.config import Application

from gpushare_hub.core import checkpointing
from gpushare_hub.core.cardmemory import sell_problem
from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.isolation import COOPERATIVE, MPS
from gpushare_hub.core.names import DEVICE_MODE_REASON, NODE_CONFIG_REASON
from gpushare_hub.core.objects import PodObject
from gpushare_hub.core.overcommit import Overcommit, overcommit_problem
from gpushare_hub.core.report import may_hold_slice
from gpushare_hub.core.resources import ResourceNames
from gpushare_hub.kube.kubeconfig import connection_problem
from gpushare_hub.kube.rest import RestClient

from .backends import Backend, BackendUnavailable, NVMLBackend, SimulatedBackend
from .devicemode import CDI
from .devicemodeapp import DeviceModeOptions, DeviceModeUnavailable
from .nodeconfig import NodeConfigError
from .nodefacts import SpecKeeper
from .options import PluginOptions
from .registration import Runner
from .response import Isolation
from .settings import Settings
from .state import PluginState


class CannotStart(GPUShareError):
    """Why the plugin cannot start, printed once by :meth:`GPUShareDevicePlugin.start`, and the
    status it exits with."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class GPUShareDevicePlugin(Application, DeviceModeOptions, PluginOptions):
    name = "gpushare-device-plugin"
    description = __doc__
    mode = "legacy"  # the node's device mode, settled at start (settle_mode)
    spec: SpecKeeper | None = None  # the plugin's CDI spec in cdi mode

    @default("log_level")
    def _log_level_default(self) -> int:
        return logging.INFO

    aliases = {  # noqa: RUF012 - traitlets reads these class attributes
        "node-name": "GPUShareDevicePlugin.node_name",
        "backend": "GPUShareDevicePlugin.backend",
        "simulate": "GPUShareDevicePlugin.simulate",
        "health-file": "GPUShareDevicePlugin.health_file",
        "plugin-dir": "GPUShareDevicePlugin.plugin_dir",
        "resource-name": "GPUShareDevicePlugin.resource_name",
        "count-resource-name": "GPUShareDevicePlugin.count_resource_name",
        "unit": "GPUShareDevicePlugin.unit",
        "reserve-fraction": "GPUShareDevicePlugin.reserve_fraction",
        "kubeconfig": "GPUShareDevicePlugin.kubeconfig",
        "node-config": "GPUShareDevicePlugin.node_config",
        "served-file": "GPUShareDevicePlugin.served_file",
        "hook-host-path": "GPUShareDevicePlugin.hook_host_path",
        "mps": "GPUShareDevicePlugin.mps",
        "mps-multi-user": "GPUShareDevicePlugin.mps_multi_user",
        "mps-root": "GPUShareDevicePlugin.mps_root",
        "cdi": "GPUShareDevicePlugin.cdi",
        "device-mode": "GPUShareDevicePlugin.device_mode",
        "cdi-dir": "GPUShareDevicePlugin.cdi_dir",
        "host-root": "GPUShareDevicePlugin.host_root",
        "driver-root": "GPUShareDevicePlugin.driver_root",
        "dev-root": "GPUShareDevicePlugin.dev_root",
        "nvidia-ctk": "GPUShareDevicePlugin.nvidia_ctk",
        "containerd-config": "GPUShareDevicePlugin.containerd_config",
        "tensorflow-memory-limit": "GPUShareDevicePlugin.tensorflow_memory_limit",
        "compute-share": "GPUShareDevicePlugin.compute_share",
        "isolation-tier": "GPUShareDevicePlugin.isolation_tier",
        "selftest-python": "GPUShareDevicePlugin.selftest_python",
        "selftest-path": "GPUShareDevicePlugin.selftest_path",
        "usage-interval": "GPUShareDevicePlugin.usage_interval",
        "usage-file": "GPUShareDevicePlugin.usage_file",
        "idle-memory-mib": "GPUShareDevicePlugin.idle_memory_mib",
        "usage-claims-dir": "GPUShareDevicePlugin.usage_claims_dir",
        "metrics-port": "GPUShareDevicePlugin.metrics_port",
        "overcommit": "GPUShareDevicePlugin.overcommit",
        "hibernation-host-memory-gib": "GPUShareDevicePlugin.hibernation_host_memory_gib",
        "hibernation-min-idle": "GPUShareDevicePlugin.hibernation_min_idle",
        "hibernation-dir": "GPUShareDevicePlugin.hibernation_dir",
        "context-mib": "GPUShareDevicePlugin.context_mib",
        "log-level": "Application.log_level",
    }

    def make_backend(self) -> Backend:
        if self.backend == "simulated":
            if not self.simulate:
                raise BackendUnavailable("--backend simulated needs --simulate, e.g. '2x Tesla T4:15360'")
            return SimulatedBackend(
                self.simulate,
                self.node_name,
                Path(self.health_file) if self.health_file else None,
                Path(self.usage_file) if self.usage_file else None,
                Path(self.usage_claims_dir) if self.usage_claims_dir else None,
            )
        return NVMLBackend()

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

    def hibernation_folder(self) -> str:
        """The pods' doors: --hibernation-dir, else beside the simulated claims, else the default."""
        from .doors import DEFAULT_HIBERNATION_DIR

        if self.hibernation_dir:
            return str(self.hibernation_dir)
        if self.backend == "simulated" and self.usage_claims_dir:
            return str(Path(self.usage_claims_dir).parent / "hibernation")
        return DEFAULT_HIBERNATION_DIR

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

    def isolation(self) -> Isolation:
        return Isolation(
            hook_host_path=self.hook_host_path,
            mps=self.mps,
            mps_root=self.mps_root,
            cdi=self.cdi,
            tensorflow_memory_limit=self.tensorflow_memory_limit,
            tier=self.tier(),
            compute_share=self.compute_share,
            context_mib=self.context_mib,
        )

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

    def start_usage(
        self,
        api: RestClient,
        state: PluginState,
        stop: threading.Event,
        claimed: Callable[[], Mapping[str, tuple[str, dict[str, int]]]] | None = None,
    ) -> None:
        """The usage loop (a daemon thread, until ``stop``) and its metrics endpoint; ``claimed``:
        the slices of the DRA claims prepared on the node (the DRA plugin's)."""

        from prometheus_client import start_http_server
        from prometheus_client.registry import CollectorRegistry

        from .kube import KubeUsageSink
        from .usage import UsageCollector, UsageReporter

        if self.usage_interval <= 0:
            return
        reporter = UsageReporter(
            state,
            KubeUsageSink(api, self.node_name),
            mps=self.mps,
            idle_memory_mib=self.idle_memory_mib,
            claimed=claimed,
        )
        if state.doors is not None:
            from .hibernation import start_keeper

            start_keeper(state, reporter, KubeUsageSink(api, self.node_name), stop)
        threading.Thread(
            target=reporter.run, args=(stop, self.usage_interval), name="usage", daemon=True
        ).start()
        if self.metrics_port:
            registry = CollectorRegistry()
            registry.register(UsageCollector(reporter))
            start_http_server(self.metrics_port, registry=registry)

    def start_selftest(self, api: RestClient, state: PluginState) -> None:
        """The isolation self-test, once, in a daemon thread (it may take a minute)."""
        from gpushare_hub.isolation.usage import slices_on_node

        from .kube import KubeUsageSink
        from .selfcheck import probe_card

        names = state.settings.names
        used: dict[str, int] = {}
        try:
            pods = state.pods.pods_on_node(self.node_name)
        except Exception as err:
            logging.getLogger("gpushare.plugin").warning("no isolation self-test: cannot list pods (%s)", err)
            return
        for _key, cards in slices_on_node(pods, state.ledger_node(), names).values():
            for uuid, mib in cards.items():
                used[uuid] = used.get(uuid, 0) + mib // names.mib_per_unit
        card = probe_card(state.inventory(), used, names.mib_per_unit)
        if card is None:
            logging.getLogger("gpushare.plugin").info(
                "no isolation self-test now: no card has room for it beside the slices held"
            )
            return
        sink = KubeUsageSink(api, self.node_name)
        args = (
            self.node_name,
            card,
            state.settings.names.mib_per_unit,
            state.settings.isolation,
            self.selftest_python or sys.executable,
            sink,
            self.selftest_path,
        )
        threading.Thread(target=self._selftest, args=args, name="selftest", daemon=True).start()

    @staticmethod
    def _selftest(*args: Any) -> None:
        from .selfcheck import check_node

        try:
            check_node(*args)
        except Exception as err:  # the check must never stop the plugin
            logging.getLogger("gpushare.plugin").warning("the isolation self-test failed to run: %s", err)

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

    def warn_node(self, api: RestClient, reason: str, err: Exception) -> None:
        """Why the plugin does not start, as a Warning event on the Node too, where an admin looks
        (``kubectl describe node``) while the plugin's pod restarts; best effort."""
        from .kube import KubeUsageSink

        try:
            KubeUsageSink(api, self.node_name).warn_node(reason, f"device plugin not started: {err}")
        except Exception as failed:  # the plugin stops with the message either way
            logging.getLogger("gpushare.plugin").warning("could not post the Warning event: %s", failed)

    def plugin_settings(self, names: ResourceNames) -> Settings:
        return Settings(
            node=self.node_name,
            names=names,
            reserve_fraction=self.reserve_fraction,
            plugin_dir=self.plugin_dir,
            served_file=self.served_file or str(Path(self.plugin_dir) / "gpushare-hub-served.json"),
            isolation=self.isolation(),
            overcommit=self.overcommit_settings(),
            hibernation_dir=self.hibernation_folder(),
        )

    def settle_mode(self, api: RestClient, backend: Backend, state: PluginState) -> None:
        """The node's device mode into the state's isolation (its CDI spec written in CDI mode);
        :class:`CannotStart`, with a Warning event on the Node, where no mode can work."""
        from dataclasses import replace

        if self.cdi and self.device_mode == "auto":
            self.device_mode = CDI
        cards = [(c.uuid, c.index) for c in state.cards]
        try:
            self.mode, self.spec = self.settle_device_mode(
                api, self.node_name, self.backend == "simulated", cards, backend.driver_version()
            )
        except DeviceModeUnavailable as err:
            self.warn_node(api, DEVICE_MODE_REASON, err)
            raise CannotStart(str(err), 1) from err
        state.settings.isolation = replace(state.settings.isolation, cdi=self.mode == CDI)

    def prepare(self) -> tuple[Backend, RestClient, PluginState]:
        """Everything the plugin needs before it serves: its cards, the API server, the start-up
        hook, its state; :class:`CannotStart` naming what is missing."""
        try:
            backend = self.make_backend()
        except BackendUnavailable as err:
            raise CannotStart(str(err), 1) from err
        from .kube import KubePods

        api = self.connect()
        self.overcommit_settings()  # refused before anything is installed
        try:
            self.install_hook()
            state = PluginState(backend, KubePods(api), self.plugin_settings(self.resource_names()))
        except GPUShareError as err:
            raise CannotStart(str(err), 1) from err
        if not state.cards:
            raise CannotStart(f"no shareable card on {self.node_name} (MIG-enabled cards are skipped)", 1)
        problem = sell_problem(
            self.node_name,
            state.cards,
            self.reserve_fraction,
            state.settings.names.mib_per_unit,
            self.context_mib,
        )
        if problem:
            self.warn_node(api, NODE_CONFIG_REASON, GPUShareError(problem))
            raise CannotStart(problem, 2)
        self.settle_mode(api, backend, state)
        return backend, api, state

    def resource_names(self) -> ResourceNames:
        return ResourceNames(memory=self.resource_name, count=self.count_resource_name, unit=self.unit)

    def start(self) -> None:
        logging.basicConfig(
            level=cast(int, self.log_level), format="%(asctime)s %(levelname)s %(name)s %(message)s"
        )
        log = logging.getLogger("gpushare.plugin")
        if not self.node_name:
            log.error("--node-name is required (set it from the downward API: spec.nodeName)")
            sys.exit(2)
        try:
            backend, api, state = self.prepare()
        except CannotStart as err:
            print(f"gpushare-device-plugin: {err}", file=sys.stderr)
            sys.exit(err.status)
        self.serve(api, state)
        backend.close()
        api.close()

    def serve(self, api: RestClient, state: PluginState) -> None:
        """Publish the inventory, serve and stay registered with the kubelet until SIGTERM or SIGINT."""
        log = logging.getLogger("gpushare.plugin")
        names = state.settings.names

        def publish() -> None:
            self.publish_inventory(api, state)

        runner = Runner(state, on_registered=publish, on_health=publish)
        self.start_usage(api, state, runner.stop)
        if self.selftest and state.cards:
            self.start_selftest(api, state)

        def stop(*_: Any) -> None:
            runner.shutdown()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        for c in state.cards:
            log.info("card %d %s %s: %d MiB, %d %s", c.index, c.uuid, c.model, c.mib, c.units, names.unit)
        log.info(
            "isolation: start-up hook %s; MPS %s; device mode %s%s; TensorFlow memory_limit %s",
            self.hook_host_path or "off",
            ("on, multi-user" if self.mps_multi_user else "on") if self.mps else "off",
            self.mode,
            f" ({self.spec.file.path})" if self.spec else "",
            "on" if self.tensorflow_memory_limit else "off",
        )
        runner.run()
        if self.spec:
            self.spec.remove()
        if state.served.remove_if_empty():
            log.info("%s removed: no served container waits for its mark", state.served.path)
        self.remove_hook_if_unused(state)

    def publish_inventory(self, api: RestClient, state: PluginState) -> None:
        """The CDI card spec made again where the driver changed under the plugin (else a no-op),
        and the node's cards and isolation on its Node; failures are logged."""
        from .kube import publish_isolation, publish_node

        log = logging.getLogger("gpushare.plugin")
        if self.spec:
            try:
                self.spec.refresh([(c.uuid, c.index) for c in state.cards], state.backend.driver_version())
            except GPUShareError as err:
                log.warning("could not make the CDI spec again: %s", err)
        try:
            publish_node(api, self.node_name, state.published_cards(), state.settings.names)
            publish_isolation(
                api,
                self.node_name,
                mps=self.mps,
                multi_user=self.mps_multi_user,
                tier=state.settings.isolation.tier,
                mode=self.mode,
                checkpoint=checkpointing.support(
                    state.backend.driver_version(), platform.machine(), self.mps
                ),
            )
        except Exception as err:
            log.warning("could not publish the card inventory on node %s: %s", self.node_name, err)

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


def main(argv: list[str] | None = None) -> None:
    GPUShareDevicePlugin.launch_instance(argv)


if __name__ == "__main__":
    main()
