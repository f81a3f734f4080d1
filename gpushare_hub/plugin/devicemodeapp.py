"""The device plugin's device-mode options, and settling the mode at start (see :mod:`.devicemode`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from traitlets import Enum, Unicode
from traitlets.config import Configurable

from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.kube.rest import RestClient

from .cdispec import DEFAULT_CDI_DIR, SpecError
from .devicemode import AUTO, CDI, MODES, choose
from .kube import node_path
from .nodefacts import DEFAULT_CONTAINERD_CONFIG, HostPaths, SpecKeeper, probe

log = logging.getLogger("gpushare.plugin")


class DeviceModeUnavailable(GPUShareError):
    """The node can hand out cards in no mode the plugin may use; the message says what is missing."""


class DeviceModeOptions(Configurable):
    device_mode = Enum(
        list(MODES),
        default_value=AUTO,
        help="""How Allocate hands a card to a container. 'cdi': the CDI device
        gpushare-hub.io/gpu=<UUID> of the plugin's own spec (written into --cdi-dir by the host's
        nvidia-ctk), applied by the runtime under plain runc: containerd 2.x, containerd 1.7 with
        enable_cdi, CRI-O; what a GPU Operator node since v25.10 needs. 'legacy':
        NVIDIA_VISIBLE_DEVICES=<UUID>, which needs nvidia as containerd's default runtime. 'auto':
        cdi where the node can, else legacy where it can; a node where neither can advertises
        nothing and says why in a Warning event. Per node: 'deviceMode' in --node-config.""",
    ).tag(config=True)
    cdi_dir = Unicode(
        DEFAULT_CDI_DIR,
        help="The CDI folder the runtime reads (the host's, mounted at the same path); the spec goes there.",
    ).tag(config=True)
    host_root = Unicode(
        "",
        help="""Where the host's root is mounted in the plugin's container (the chart: /host, read-only),
        to run the host's nvidia-ctk against the host's driver and read containerd's config.
        Empty: the plugin runs on the host itself.""",
    ).tag(config=True)
    driver_root = Unicode(
        "/",
        help="""The driver's root on the host: '/' for a host-installed driver, /run/nvidia/driver for
        the GPU Operator's driver container.""",
    ).tag(config=True)
    dev_root = Unicode("/", help="Where the host's /dev is rooted (its nvidia* device nodes).").tag(
        config=True
    )
    nvidia_ctk = Unicode(
        "",
        help="""The host's nvidia-ctk (a host path). Empty: /usr/local/nvidia/toolkit/nvidia-ctk (the GPU
        Operator's toolkit DaemonSet), then /usr/bin/nvidia-ctk and /usr/local/bin/nvidia-ctk.""",
    ).tag(config=True)
    containerd_config = Unicode(
        DEFAULT_CONTAINERD_CONFIG,
        help="""containerd's config on the host, read (with the files it imports) for enable_cdi and
        the default runtime; k3s and RKE2 keep theirs under /var/lib/rancher.""",
    ).tag(config=True)

    def host_paths(self) -> HostPaths:
        return HostPaths(
            cdi_dir=self.cdi_dir,
            host_root=self.host_root,
            driver_root=self.driver_root,
            dev_root=self.dev_root,
            nvidia_ctk=self.nvidia_ctk,
            containerd_config=self.containerd_config,
        )

    def settle_device_mode(
        self, api: RestClient, node: str, simulated: bool, cards: Sequence[tuple[str, int]], driver: str
    ) -> tuple[str, SpecKeeper | None]:
        """The mode this node uses, with its spec written in CDI mode; :class:`DeviceModeUnavailable`
        naming what each mode lacks where none can work."""
        try:
            info = (api.get(node_path(node)).get("status") or {}).get("nodeInfo") or {}
            runtime = str(info.get("containerRuntimeVersion") or "")
        except Exception as err:  # the runtime is then unknown, which rules out CDI in auto
            log.warning("cannot read node %s for its container runtime: %s", node, err)
            runtime = ""
        paths = self.host_paths()
        facts = probe(runtime, paths, simulated)
        choice = choose(str(self.device_mode), facts)
        keeper: SpecKeeper | None = None
        if choice.mode == CDI:
            keeper = SpecKeeper(paths, facts.spec_source)
            try:
                keeper.refresh(cards, driver)
            except SpecError as err:  # in auto, legacy may still work
                keeper = None
                choice = choose(str(self.device_mode), replace(facts, spec_problem=str(err)))
        if choice.mode is None:
            raise DeviceModeUnavailable(f"this node can hand out no card: {choice.explain()}")
        if choice.missing:
            log.info("device mode %s (not %s)", choice.mode, choice.explain())
        return choice.mode, keeper
