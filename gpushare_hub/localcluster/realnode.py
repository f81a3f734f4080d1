"""One real node of the local cluster (:mod:`.realnodes` starts them): its folders and the paths
they are bound over in its mount namespace, the process that holds its namespaces, containerd's
``ctr`` for it, and what kills what it leaves behind when it stops; and the machine-wide kernel
settings a kubelet changes, read before and put back after."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import netns, noderuntime
from .processes import Component, HarnessError

# Paths inside a node's mount namespace that get the node's own folder.
NODE_PATHS = (
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/run/containerd",
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/etc/cni/net.d",
    "/run/netns",
    # The device plugin's host folders (the chart's hookHostPath and mpsRoot).
    "/var/lib/gpushare-hub",
    "/run/gpushare-hub",
    # Node-local data, e.g. the hub database's hostPath PersistentVolume (examples/hub-db-pv.yaml).
    "/var/lib/jupyterhub",
    # containerd's and the NVIDIA runtime's configs, and the CDI folder (/var/run/cdi).
    *noderuntime.PATHS,
)
# Machine-wide settings a kubelet writes at start (not per namespace); put back when the nodes stop.
KERNEL_TUNABLES = (
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


@dataclass
class RealNode:
    net: netns.NodeNet
    folder: Path
    ctr_bin: Path = Path("ctr")
    legacy: bool = False  # nvidia as containerd's default runtime, in the toolkit's legacy mode
    holder: Component | None = None
    components: dict[str, Component] = field(default_factory=dict)
    created_mountpoints: list[Path] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.net.name

    @property
    def containerd_socket(self) -> Path:
        return self.folder / "run-containerd" / "containerd.sock"

    def enter(self) -> list[str]:
        """The prefix that runs a program inside this node (its mount and network namespaces)."""
        assert self.holder is not None and self.holder.pid is not None
        return ["nsenter", f"--target={self.holder.pid}", "--mount", "--net", "--"]

    def ctr(self, *args: str, check: bool = True, timeout: float = 300) -> str:
        cmd = [str(self.ctr_bin), f"--address={self.containerd_socket}", "--namespace=k8s.io", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise HarnessError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")
        return proc.stdout


def read_tunables() -> dict[str, str]:
    out = {}
    for name in KERNEL_TUNABLES:
        with contextlib.suppress(OSError):
            out[name] = (Path("/proc/sys") / name).read_text().strip()
    return out


def restore_tunables(saved: Mapping[str, str]) -> None:
    """Write back what :func:`read_tunables` read where a kubelet changed it (kernel.panic and
    the others: the kubelet sets them for the whole machine)."""
    for name, value in saved.items():
        path = Path("/proc/sys") / name
        with contextlib.suppress(OSError):
            if path.read_text().strip() != value:
                path.write_text(value + "\n")


def host_path_of(node: RealNode, path: str) -> Path:
    """Where ``path`` on ``node`` (under one of :data:`NODE_PATHS`) is on this machine."""
    path = "/run/" + path[len("/var/run/") :] if path.startswith("/var/run/") else path
    for root in NODE_PATHS:
        if path == root or path.startswith(root + "/"):
            return node.folder / root.strip("/").replace("/", "-") / path[len(root) :].lstrip("/")
    raise HarnessError(f"{path} is not under a node folder ({', '.join(NODE_PATHS)})")


def kill_container_cgroups(node: RealNode) -> None:
    """The backstop when containerd could not kill its tasks (it died, ctr timed out): every
    process in a cgroup of one of this node's containers is killed and the cgroups removed."""
    tasks = node.folder / "run-containerd" / "io.containerd.runtime.v2.task" / "k8s.io"
    ids = [d.name for d in tasks.iterdir()] if tasks.is_dir() else []
    cgroups = [c / "k8s.io" / i for c in Path("/sys/fs/cgroup").iterdir() for i in ids]
    for cgroup in cgroups:
        with contextlib.suppress(OSError, ValueError):
            for pid in (cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), 9)
    for cgroup in cgroups:
        for _ in range(20):
            try:
                cgroup.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # still emptying
                time.sleep(0.1)


def kill_containers(node: RealNode) -> None:
    """Every container task killed and deleted (runc removes its cgroups and mounts)."""
    tasks = [line.split()[0] for line in node.ctr("tasks", "ls").splitlines()[1:] if line.strip()]
    for task in tasks:
        node.ctr("tasks", "kill", "--signal=SIGKILL", "--all", task, check=False, timeout=20)
    for task in tasks:
        node.ctr("tasks", "delete", "--force", task, check=False, timeout=30)


def kill_namespace_members(node: RealNode) -> None:
    """Whatever still runs in the node's mount namespace (containerd's shims) is killed."""
    assert node.holder is not None and node.holder.pid is not None
    try:
        ns = os.readlink(f"/proc/{node.holder.pid}/ns/mnt")
    except OSError:
        return
    for _ in range(3):
        members = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == node.holder.pid:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(proc / "ns" / "mnt") == ns:
                    members.append(int(proc.name))
        if not members:
            return
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        time.sleep(0.5)
