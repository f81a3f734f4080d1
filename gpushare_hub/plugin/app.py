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
from pathlib import Path
from typing import Any, cast

from traitlets import default
from traitlets.config import Application

from gpushare_hub.core import checkpointing
from gpushare_hub.core.cardmemory import sell_problem
from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.names import DEVICE_MODE_REASON, NODE_CONFIG_REASON
from gpushare_hub.core.resources import ResourceNames
from gpushare_hub.kube.rest import RestClient

from .backends import Backend, BackendUnavailable, NVMLBackend, SimulatedBackend
from .devicemode import CDI
from .devicemodeapp import DeviceModeOptions, DeviceModeUnavailable
from .hookkeeping import HookKeeping
from .nodefacts import SpecKeeper
from .options import PluginOptions
from .registration import Runner
from .response import Isolation
from .settings import Settings
from .sidework import SideWork
from .startchecks import CannotStart, StartChecks
from .state import PluginState


class GPUShareDevicePlugin(StartChecks, HookKeeping, SideWork, Application, DeviceModeOptions, PluginOptions):
    # Its start and serving here; its checks, the start-up hook's files and the threads beside
    # the gRPC in .startchecks, .hookkeeping and .sidework.

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
        self.socket_paths()
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


def main(argv: list[str] | None = None) -> None:
    GPUShareDevicePlugin.launch_instance(argv)


if __name__ == "__main__":
    main()
