"""The device plugin's work beside the kubelet's gRPC, each in a daemon thread: the usage loop
(with the hibernation keeper and the metrics endpoint) and the isolation self-test."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gpushare_hub.kube.rest import RestClient

from .state import PluginState

if TYPE_CHECKING:  # the plugin's options, which GPUShareDevicePlugin has (a part, not a Configurable)
    from .options import PluginOptions as _Options
else:
    _Options = object


class SideWork(_Options):
    """The threads beside the gRPC (a part of :class:`~.app.GPUShareDevicePlugin`)."""

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
