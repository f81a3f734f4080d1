"""``gpushare-dra-plugin``: the DRA kubelet plugin of gpushare-hub (docs/dra.md).

The same node agent as ``gpushare-device-plugin`` (cards from NVML or a declaration, the start-up
hook, the node's options, its device mode and CDI card spec, health, the isolation self-test), but
instead of extended resources it publishes the node's ResourceSlice and prepares the claims the
default scheduler allocated on it::

    gpushare-dra-plugin --node-name $NODE_NAME --memory-sizes 3Gi,5Gi,7Gi

For tests and the demo::

    gpushare-dra-plugin --backend simulated --simulate "2x Tesla T4:15360" --node-name gpu-1 \\
        --kubeconfig kc --dra-plugin-dir /tmp/dra --registry-dir /tmp/reg --cdi-dir /tmp/cdi
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from traitlets import Float, Unicode

from gpushare_hub.core.draslice import SizesError, parse_sizes, resource_slice
from gpushare_hub.core.names import DRA_DRIVER
from gpushare_hub.core.overcommit import Overcommit
from gpushare_hub.kube.rest import RestClient

from ..app import GPUShareDevicePlugin
from ..health import watch_health
from ..startchecks import CannotStart
from ..state import PluginState
from .cdiclaims import leftover_specs
from .driver import Driver, DriverConfig
from .prepared import PreparedClaims
from .publisher import KubeClaims, SlicePublisher
from .servicer import Sockets

log = logging.getLogger("gpushare.dra")


class GPUShareDRAPlugin(GPUShareDevicePlugin):
    name = "gpushare-dra-plugin"
    description = __doc__

    dra_plugin_dir = Unicode(
        f"/var/lib/kubelet/plugins/{DRA_DRIVER}",
        help="Where the DRA socket and the record of prepared claims live (the same path on the host).",
    ).tag(config=True)
    registry_dir = Unicode(
        "/var/lib/kubelet/plugins_registry",
        help="The kubelet's plugin watcher folder, where the registration socket is made.",
    ).tag(config=True)
    memory_sizes = Unicode(
        "",
        help="The slice sizes the hub's catalogue offers, e.g. 3Gi,5Gi,7Gi: each card's request policy "
        "(validValues); a claim of another size is refused. Empty: any whole number of units.",
    ).tag(config=True)
    check_interval = Float(
        5.0, help="Seconds between checks that the node's ResourceSlice is as published."
    ).tag(config=True)

    aliases = {  # noqa: RUF012 - traitlets reads these class attributes
        **GPUShareDevicePlugin.aliases,
        "dra-plugin-dir": "GPUShareDRAPlugin.dra_plugin_dir",
        "registry-dir": "GPUShareDRAPlugin.registry_dir",
        "memory-sizes": "GPUShareDRAPlugin.memory_sizes",
        "check-interval": "GPUShareDRAPlugin.check_interval",
    }

    def start(self) -> None:
        try:
            parse_sizes(self.memory_sizes)
        except SizesError as err:
            print(f"gpushare-dra-plugin: --memory-sizes: {err}", file=sys.stderr)
            sys.exit(2)
        if not self.served_file:  # the device plugin's record; unused here, kept out of the kubelet's folder
            self.served_file = str(Path(self.dra_plugin_dir) / "served.json")
        super().start()

    def overcommit_settings(self) -> Overcommit:
        """Overcommit is the device plugin's (docs/dra.md): refused here, naming the fix."""
        if self.overcommit != 1.0:
            raise CannotStart(
                f"node {self.node_name}: --overcommit {self.overcommit!r} is for the device-plugin path "
                "(gpushare-device-plugin) only; on the DRA path hibernation works inside each pod but a "
                "card holds no more than its memory: give --overcommit 1, or serve this node with the "
                "device plugin",
                2,
            )
        return Overcommit()

    def serve(self, api: RestClient, state: PluginState) -> None:
        names = state.settings.names
        unit_bytes = names.mib_per_unit << 20
        sizes = parse_sizes(self.memory_sizes)
        prepared = PreparedClaims(self.dra_plugin_dir)
        node_uid = str(
            ((api.get(f"/api/v1/nodes/{self.node_name}") or {}).get("metadata") or {}).get("uid") or ""
        )

        def wanted(generation: int) -> dict[str, Any]:
            return resource_slice(
                self.node_name,
                node_uid,
                state.inventory(),
                unit_bytes=unit_bytes,
                sizes=sizes,
                tier=state.settings.isolation.tier,
                generation=generation,
                used=prepared.held(),
            )

        publisher = SlicePublisher(api, self.node_name, wanted)

        def publish() -> None:
            self.publish_inventory(api, state)
            publisher.try_publish()

        config = DriverConfig(self.node_name, unit_bytes, names.mib_per_unit, sizes, self.cdi_dir)
        driver = Driver(
            config,
            state.inventory,
            lambda: state.settings.isolation,
            KubeClaims(api),
            prepared,
            on_change=publisher.try_publish,
        )
        for stale in leftover_specs(self.cdi_dir, set(prepared.claims)):
            stale.unlink(missing_ok=True)  # a claim unprepared while the plugin was away
            log.info("removed %s: its claim is not prepared", stale)
        sockets = Sockets(self.dra_plugin_dir, self.registry_dir, driver, on_registered=publish)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        publish()
        sockets.start()
        threading.Thread(target=watch_health, args=(state, stop, publish), name="health", daemon=True).start()
        self.start_usage(api, state, stop, claimed=prepared.slices)
        if self.selftest and state.cards:
            self.start_selftest(api, state)
        log.info(
            "DRA driver %s on %s: %d card(s), sizes %s; device mode %s",
            DRA_DRIVER,
            self.node_name,
            len(state.cards),
            self.memory_sizes or "any whole unit",
            self.mode,
        )
        publisher.run(stop, self.check_interval)
        sockets.stop()
        self.leave(publisher, prepared, state)

    def leave(self, publisher: SlicePublisher, prepared: PreparedClaims, state: PluginState) -> None:
        """On SIGTERM: the slice goes (nothing new is allocated here without a plugin); the card
        spec, the record and the hook go when no prepared claim uses them (an uninstall leaves no
        file; a restart with notebooks running keeps what they use)."""
        publisher.delete()
        if prepared.remove_file_if_empty():
            if self.spec:
                self.spec.remove()
            self.remove_hook_if_unused(state)
        else:
            log.info(
                "%d prepared claim(s) kept in %s for the next start", len(prepared.claims), prepared.path
            )


def main(argv: list[str] | None = None) -> None:
    GPUShareDRAPlugin.launch_instance(argv)
