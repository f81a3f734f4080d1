"""A real node's container runtime as a lab's GPU node has it: containerd 2 with CDI (built from its Go
module), runc from Debian, and the NVIDIA container toolkit configured the way the GPU Operator's
toolkit DaemonSet configures a node in CDI mode (v26.7's ``transformToolkitCtrForCDI``): an
``nvidia`` runtime handler beside runc, not the default, the runtime's own mode ``cdi`` with the
default kind ``management.nvidia.com/gpu``; and simulated cards as device nodes.

Paths are the node's own (its mount namespace binds its folders over them, see
:data:`.realnode.NODE_PATHS`): ``/etc/containerd/config.toml`` and the toolkit's drop-in
``/etc/containerd/conf.d/99-nvidia.toml``, ``/etc/nvidia-container-runtime/config.toml``, and the
CDI folder ``/var/run/cdi``, where the device plugin writes its spec.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
TOOLKIT_DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
RUNTIME_CONFIG = "/etc/nvidia-container-runtime/config.toml"
# containerd's per-registry hosts (``config_path``): where a node pulls each registry's images from.
REGISTRY_HOSTS = "/etc/containerd/certs.d"
# The registries our chart, Zero to JupyterHub and the kubelet name images in: a local node pulls
# each of them from the harness's own registry (:func:`mirror_hosts`).
MIRRORED = ("ghcr.io", "registry.k8s.io", "quay.io")
# The node's own folders for these (added to the node's mount namespace).
PATHS = ("/etc/containerd", "/etc/nvidia-container-runtime", "/run/cdi")
MANAGEMENT_KIND = (
    "management.nvidia.com/gpu"  # the operator's NVIDIA_CONTAINER_RUNTIME_MODES_CDI_DEFAULT_KIND
)
# Simulated cards' device nodes: NVIDIA's character major for the cards and nvidiactl; nvidia-uvm's
# major is given out at load time on a real machine, any free one stands in.
NVIDIA_MAJOR = 195
UVM_MAJOR = 235
CONTROL = {"nvidiactl": (NVIDIA_MAJOR, 255), "nvidia-uvm": (UVM_MAJOR, 0), "nvidia-uvm-tools": (UVM_MAJOR, 1)}


def containerd_config(sandbox_image: str, cni_bin: Path) -> str:
    """containerd 2's config (version 3) before the toolkit adds its runtime: CDI as 2.x has it by
    default, the folders NVIDIA's and our specs go to, runc as the default runtime, registries'
    hosts in :data:`REGISTRY_HOSTS`."""
    return f"""version = 3
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{REGISTRY_HOSTS}"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{sandbox_image}"
[plugins.'io.containerd.cri.v1.runtime']
  # Containers may not set an OOM score below containerd's own (needed without a systemd unit).
  restrict_oom_score_adj = true
  disable_apparmor = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "/etc/cni/net.d"
"""


def mirror_hosts(mirror: str) -> dict[str, str]:
    """Each mirrored registry's ``hosts.toml`` (path on the node -> text): pull and resolve from
    ``http://<mirror>`` (the harness's registry, plain HTTP), the registry itself after it. An image
    keeps its name (``ghcr.io/gpushare-hub/gpushare-extender:0.1.0``), as on a lab's node that
    pulls it from ghcr.io; containerd asks the mirror for the same path."""
    return {
        f"{REGISTRY_HOSTS}/{host}/hosts.toml": (
            f'server = "https://{host}"\n\n[host."http://{mirror}"]\n  capabilities = ["pull", "resolve"]\n'
        )
        for host in MIRRORED
    }


def toolkit_commands(toolkit: Path, legacy: bool = False, cli: Path | None = None) -> list[list[str]]:
    """The toolkit's own configuration of the node, run inside it: the ``nvidia`` runtime in
    containerd's drop-in, and the runtime's config.

    CDI mode (the operator's default since v25.10): ``nvidia`` beside runc, not the default; the
    runtime's mode ``cdi``. Legacy mode (the operator with ``cdi.enabled=false`` and the toolkit's
    ``NVIDIA_CONTAINER_RUNTIME_MODE=legacy``): ``nvidia`` the default runtime, its mode ``legacy``:
    NVIDIA's prestart hook (``nvidia-container-runtime-hook``) calls ``cli`` for each container
    whose ``NVIDIA_VISIBLE_DEVICES`` names cards. (``auto``, the toolkit's default, means
    ``jit-cdi`` in v1.20: a spec made in memory from NVML, which simulated cards cannot answer.)
    """
    ctk = str(toolkit / "nvidia-ctk")
    configure = [
        ctk, "runtime", "configure", "--runtime=containerd", f"--config={CONTAINERD_CONFIG}",
        f"--drop-in-config={TOOLKIT_DROP_IN}", "--config-source=file", "--nvidia-runtime-name=nvidia",
        f"--nvidia-runtime-path={toolkit / 'nvidia-container-runtime'}",
        f"--nvidia-set-as-default={'true' if legacy else 'false'}",
    ]  # fmt: skip
    if not legacy:
        configure.append("--cdi.enabled")
    runtime = [
        ctk, "config", f"--config-file={RUNTIME_CONFIG}", "--in-place",
        f"--set=nvidia-container-runtime.mode={'legacy' if legacy else 'cdi'}",
        f"--set=nvidia-container-runtime.modes.cdi.default-kind={MANAGEMENT_KIND}",
        f"--set=nvidia-ctk.path={ctk}",
    ]  # fmt: skip
    if legacy:
        if cli is None:
            raise ValueError("legacy mode needs the nvidia-container-cli the hook calls")
        runtime += [
            f"--set=nvidia-container-runtime-hook.path={toolkit / 'nvidia-container-runtime-hook'}",
            f"--set=nvidia-container-cli.path={cli}",
        ]
    return [configure, [ctk, "config", "default", f"--output={RUNTIME_CONFIG}"], runtime]


def fake_cli_script(python: str, cards_file: str) -> str:
    """The node's ``nvidia-container-cli``: :mod:`.fakecli` with the node's card file."""
    return f'#!/bin/sh\nexec {python} -m gpushare_hub.localcluster.fakecli --cards {cards_file} "$@"\n'


MANAGEMENT_SPEC = "/var/run/cdi/management.nvidia.com-gpu.yaml"


def management_spec(cards: int) -> dict[str, object]:
    """The spec the operator's toolkit DaemonSet writes in CDI mode (``nvidia-ctk cdi generate
    --mode=management``), which the ``nvidia`` runtime applies for ``NVIDIA_VISIBLE_DEVICES=all``
    (the device plugin's own pod): ``management.nvidia.com/gpu=all``, every device node; no driver
    libraries or hooks, as simulated cards have no driver."""
    nodes = [f"/dev/nvidia{i}" for i in range(cards)] + [f"/dev/{name}" for name in CONTROL]
    return {
        "cdiVersion": "0.5.0",
        "kind": MANAGEMENT_KIND,
        "devices": [{"name": "all", "containerEdits": {"deviceNodes": [{"path": p} for p in nodes]}}],
    }


def make_device_nodes(dev: Path, cards: int) -> list[Path]:
    """Character devices standing in for ``nvidia0``.. and the control nodes, made only where
    absent (a machine with a real card keeps its own); returns the ones made, to remove."""
    made = []
    wanted = {f"nvidia{i}": (NVIDIA_MAJOR, i) for i in range(cards)} | CONTROL
    for name, (major, minor) in wanted.items():
        path = dev / name
        if path.exists():
            continue
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        made.append(path)
    return made


def remove_device_nodes(made: list[Path]) -> None:
    for path in made:
        with contextlib.suppress(OSError):
            path.unlink()
