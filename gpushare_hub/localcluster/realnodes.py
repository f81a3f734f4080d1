"""Real nodes for the local cluster: kubelet + containerd 2 (with CDI and the NVIDIA container
toolkit's runtime, see :mod:`.noderuntime`) and Debian's runc, in namespaces.

Each real node is a network namespace (:mod:`.netns`) and a private mount namespace held by a
small process; the node's containerd, kubelet and kube-proxy run inside both. The mount
namespace binds the node's own folders (under the cluster's work folder) over the paths a
kubelet and containerd use (``/var/lib/kubelet``, ``/run/containerd`` ...), so several nodes
share this machine without sharing a file, and every mount they make (container root
filesystems, secret volumes, pod network namespaces) goes when the node stops.

Beside the nodes: CoreDNS answers the cluster's names (``kube-dns`` at 10.96.0.10), the API
server is offered to the nodes and pods at 10.200.0.1, so is the harness's image registry (every
node's containerd pulls ghcr.io's, registry.k8s.io's and quay.io's names from it, as a lab's node
pulls them from those registries: no image is imported), and the API server reaches kubelets
(logs, exec) through an HTTP CONNECT proxy on a Unix socket. Nothing leaves the machine: the
namespaces have no route outside, and what the host must reach is forwarded to 127.0.0.1.

The machine must be Linux with the cgroup v1 hierarchy (as the test machines have), root, ``ip``,
``nsenter``, ``unshare``, runc and the CNI plugins (``make system-deps`` installs the Debian
packages); containerd and the toolkit are built from their Go modules (:mod:`.runtimebuild`).
Simulated cards appear as device nodes (``/dev/nvidia0``.., ``nvidiactl``, ``nvidia-uvm``) made
where the machine has none, and removed with the nodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import yaml

from gpushare_hub.plugin.backends import simulated_uuid

from . import build, netns, nodeconfigs, noderuntime, runtimebuild
from .hostcheck import CNI_BIN, check_host
from .pki import PKI
from .processes import Component, HarnessError
from .realnode import (
    NODE_PATHS,
    RealNode,
    host_path_of,
    kill_container_cgroups,
    kill_containers,
    kill_namespace_members,
    read_tunables,
    restore_tunables,
)

# Where the nodes pull images from: the harness's registry, forwarded onto the underlay.
MIRROR = f"{netns.GATEWAY}:5000"


class NodesCluster(Protocol):
    """What the real nodes ask of their cluster (a :class:`~.cluster.LocalCluster` started with
    ``real_nodes=True``), and no more: this module does not know the cluster's class."""

    @property
    def network(self) -> netns.Network | None:
        """The underlay and the nodes' namespaces."""

    @property
    def workdir(self) -> Path: ...

    @property
    def logs(self) -> Path: ...

    @property
    def bin_dir(self) -> Path: ...

    @property
    def node_server(self) -> str:
        """The API server as nodes and pods reach it."""

    @property
    def pki(self) -> PKI | None: ...

    def on_stop_first(self, cleanup: Callable[[], None]) -> None: ...

    def wait_nodes_ready(self, names: Iterable[str], timeout: float = 120) -> None: ...

    def grant(self, user: str, rules: list[dict[str, Any]]) -> None: ...

    def credential(self, name: str, user: str, groups: Iterable[str] = (), server: str = "") -> Path: ...

    def api_client(self, kubeconfig: Path | None = None) -> Any: ...

    def core_api(self, kubeconfig: Path | None = None) -> Any: ...


class RealNodes:
    """The real nodes of one :class:`~.cluster.LocalCluster` (started with ``real_nodes=True``)."""

    def __init__(self, cluster: NodesCluster, registry: str, sandbox_image: str, cards: int = 2) -> None:
        check_host()
        try:
            self.containerd_dir, self.toolkit_dir = runtimebuild.build_runtime()
        except build.BuildError as err:
            raise HarnessError(f"cannot build the nodes' runtime: {err}") from err
        if cluster.network is None:
            raise HarnessError("the cluster was not started with real_nodes=True")
        self.cluster = cluster
        self.network = cluster.network
        self.registry = registry  # HOST:PORT on this machine that every node pulls its images from
        self.sandbox_image = sandbox_image  # the pause image, as containerd's CRI names it
        self.folder = cluster.workdir / "real"
        self.nodes: dict[str, RealNode] = {}
        self.coredns: Component | None = None
        self.forwarders: list[Component] = []
        # containerd's parent cgroup per controller ("k8s.io"), removed at the end if we made it.
        self._cgroups = [
            p / "k8s.io" for p in Path("/sys/fs/cgroup").iterdir() if not (p / "k8s.io").exists()
        ]
        self._tunables = read_tunables()
        self.cards = cards
        self._devices = noderuntime.make_device_nodes(Path("/dev"), cards)
        cluster.on_stop_first(self.stop)

    # ---- the whole ---------------------------------------------------------------------
    def add(
        self, count: int, prefix: str = "real-", labels: Mapping[str, str] | None = None, legacy: bool = False
    ) -> list[str]:
        """``count`` real nodes, Ready, each with every image imported; ``legacy``: with ``nvidia``
        as containerd's default runtime in the toolkit's legacy mode
        (:func:`.noderuntime.toolkit_commands`)."""
        if self.coredns is None:
            self._start_dns()
            self._start_mirror()
            self._add_runtime_class()
        names = []
        for _ in range(count):
            name = f"{prefix}{len(self.nodes)}"
            self._start_node(name, {"gpushare": "true", **(labels or {})}, legacy)
            names.append(name)
        self.cluster.wait_nodes_ready(names, timeout=180)
        return names

    def stop(self) -> None:
        """Every node, then DNS and the forwarders; each step runs even if one before it failed."""
        try:
            for node in reversed(list(self.nodes.values())):
                try:
                    self._stop_node(node)
                except Exception as err:  # the next node and the rest still go
                    print(f"[localcluster] stopping {node.name}: {err}", file=sys.stderr)
        finally:
            for comp in [self.coredns, *self.forwarders]:
                if comp is not None:
                    comp.stop(grace=3)
            self.nodes.clear()
            noderuntime.remove_device_nodes(self._devices)
            for cgroup in self._cgroups:
                with contextlib.suppress(OSError):
                    cgroup.rmdir()
            restore_tunables(self._tunables)

    def forward_to_host(self, target: str, node: str | None = None) -> str:
        """``HOST:PORT`` as seen from inside a node (a Service or pod address) offered on
        127.0.0.1; returns ``127.0.0.1:<port>``."""
        real = self.nodes[node] if node else next(iter(self.nodes.values()))
        sock = netns.listening_socket("127.0.0.1", 0)
        port = sock.getsockname()[1]
        name = f"forward-{port}"
        comp = netns.start_forwarder(name, sock, target, self.cluster.logs / f"{name}.log", ns=real.net.ns)
        self.forwarders.append(comp)
        return f"127.0.0.1:{port}"

    def host_path(self, node: str, path: str) -> Path:
        """Where ``path`` on ``node`` (under one of :data:`NODE_PATHS`) is on this machine."""
        return self.host_path_of(self.nodes[node], path)

    host_path_of = staticmethod(host_path_of)

    # ---- shared parts ---------------------------------------------------------------------
    def _start_dns(self) -> None:
        cluster = self.cluster
        cluster.grant("system:coredns", nodeconfigs.COREDNS_RULES)
        kubeconfig = cluster.credential("coredns", "system:coredns", server=cluster.node_server)
        corefile = cluster.workdir / "Corefile"
        corefile.write_text(nodeconfigs.corefile(kubeconfig))
        binary = runtimebuild.build_coredns()
        self.coredns = Component(
            "coredns",
            netns.in_ns(self.network.underlay, str(binary), "-conf", str(corefile)),
            cluster.logs / "coredns.log",
        ).start()
        core = cluster.core_api()
        core.create_namespaced_service("kube-system", nodeconfigs.kube_dns_service())
        from kubernetes import client

        slice_body = nodeconfigs.kube_dns_slice()
        discovery: Any = client.DiscoveryV1Api(cluster.api_client())  # takes the plain dict as it is
        discovery.create_namespaced_endpoint_slice("kube-system", slice_body)

    def _start_mirror(self) -> None:
        """The registry, as the nodes reach it: :data:`MIRROR` on the underlay, forwarded to
        :attr:`registry` on this machine (containerd's hosts files name it for ghcr.io,
        registry.k8s.io and quay.io)."""
        host, port = MIRROR.rsplit(":", 1)
        sock = netns.listening_socket(host, int(port), ns=self.network.underlay)
        log = self.cluster.logs / "registry-mirror.log"
        self.forwarders.append(netns.start_forwarder("registry-mirror", sock, self.registry, log))

    def _add_runtime_class(self) -> None:
        """The RuntimeClass ``nvidia`` for the toolkit's runtime handler, as the GPU Operator makes it."""
        from kubernetes import client

        body = nodeconfigs.runtime_class()
        nodes: Any = client.NodeV1Api(self.cluster.api_client())  # takes the plain dict as it is
        nodes.create_runtime_class(body)

    # ---- one node -----------------------------------------------------------------------
    def _start_node(self, name: str, labels: Mapping[str, str], legacy: bool = False) -> RealNode:
        net = self.network.add_node(name)
        node = RealNode(net, self.folder / name, ctr_bin=self.containerd_dir / "ctr", legacy=legacy)
        self.nodes[name] = node
        node.folder.mkdir(parents=True, exist_ok=True)
        self._start_holder(node)
        self._start_containerd(node)
        self._start_kubelet(node, labels)
        self._start_kube_proxy(node)
        return node

    def _start_holder(self, node: RealNode) -> None:
        # The copies of the host's network-namespace mounts would keep those namespaces (other
        # clusters' too) alive as long as this node: drop them first.
        lines = ["umount -R -l /run/netns 2>/dev/null || true", "set -e"]
        for target in NODE_PATHS:
            src = node.folder / target.strip("/").replace("/", "-")
            src.mkdir(parents=True, exist_ok=True)
            missing = [p for p in (Path(target), *Path(target).parents) if not p.exists()]
            node.created_mountpoints += [p for p in missing if p not in node.created_mountpoints]
            lines.append(f"mkdir -p {target} && mount --bind {src} {target}")
        ready = node.folder / "mounted"
        lines += [f"touch {ready}", "exec sleep infinity"]
        argv = netns.in_ns(
            node.net.ns, "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "\n".join(lines)
        )
        node.holder = Component(
            f"{node.name}-namespaces", argv, self.cluster.logs / f"{node.name}-namespaces.log"
        ).start()
        node.holder.wait_until(ready.exists, 30, "holding the node's namespaces")

    def _run_in(self, node: RealNode, name: str, argv: list[str]) -> Component:
        comp = Component(
            f"{node.name}-{name}", node.enter() + argv, self.cluster.logs / f"{node.name}-{name}.log"
        )
        node.components[name] = comp  # recorded first: stopped even if its start fails half-way
        comp.start()
        return comp

    def _start_containerd(self, node: RealNode) -> None:
        config = self.host_path_of(node, noderuntime.CONTAINERD_CONFIG)
        config.write_text(noderuntime.containerd_config(self.sandbox_image, CNI_BIN))
        for path, text in noderuntime.mirror_hosts(MIRROR).items():
            hosts = self.host_path_of(node, path)
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(text)
        cli = self._fake_cli(node) if node.legacy else None  # only NVIDIA's legacy hook calls it
        for argv in noderuntime.toolkit_commands(self.toolkit_dir, node.legacy, cli):
            proc = subprocess.run(node.enter() + argv, capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                raise HarnessError(f"`{' '.join(argv[:3])}` on {node.name} failed: {proc.stderr.strip()}")
        if not node.legacy:
            spec = self.host_path_of(node, noderuntime.MANAGEMENT_SPEC)
            spec.parent.mkdir(parents=True, exist_ok=True)
            spec.write_text(json.dumps(noderuntime.management_spec(self.cards), indent=2))
        (node.folder / "etc-cni-net.d" / "10-gpushare.conflist").write_text(
            nodeconfigs.cni_conflist(node.net)
        )
        path = f"PATH={self.containerd_dir}{os.pathsep}{os.environ.get('PATH', '')}"  # its shim, then runc
        argv = [
            "env",
            path,
            str(self.containerd_dir / "containerd"),
            f"--config={noderuntime.CONTAINERD_CONFIG}",
        ]
        comp = self._run_in(node, "containerd", [*argv, "--log-level=warn"])
        comp.wait_until(lambda: bool(node.ctr("version", timeout=5)), 60, "serving its socket")

    def _fake_cli(self, node: RealNode) -> Path:
        """The node's nvidia-container-cli for NVIDIA's legacy hook (:mod:`.fakecli`), with its
        cards' UUIDs as the device plugin gives them to simulated cards."""
        cards = node.folder / "simulated-cards.json"
        cards.write_text(json.dumps({simulated_uuid(node.name, i): i for i in range(self.cards)}))
        cli = node.folder / "nvidia-container-cli"
        cli.write_text(noderuntime.fake_cli_script(sys.executable, str(cards)))
        cli.chmod(0o755)
        return cli

    def _start_kubelet(self, node: RealNode, labels: Mapping[str, str]) -> None:
        cluster = self.cluster
        assert cluster.pki is not None
        kubeconfig = cluster.credential(
            f"kubelet-{node.name}", f"system:node:{node.name}", ["system:nodes"], server=cluster.node_server
        )
        resolv = node.folder / "resolv.conf"
        resolv.write_text("# no upstream: names outside the cluster do not resolve\n")
        config = nodeconfigs.kubelet_config(cluster.pki.ca, node.net.address, resolv)
        path = node.folder / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        self._run_in(
            node,
            "kubelet",
            [
                str(cluster.bin_dir / "kubelet"),
                f"--config={path}",
                f"--kubeconfig={kubeconfig}",
                f"--hostname-override={node.name}",
                f"--node-ip={node.net.address}",
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
                "--v=2",
            ],
        )

    def restart_kubelet(self, name: str) -> None:
        """Stop the node's kubelet and start it again with the same configuration."""
        comp = self.nodes[name].components["kubelet"]
        comp.stop()
        comp.start()

    def _start_kube_proxy(self, node: RealNode) -> None:
        cluster = self.cluster
        kubeconfig = cluster.credential(
            f"kube-proxy-{node.name}", "system:kube-proxy", server=cluster.node_server
        )
        config = nodeconfigs.kube_proxy_config(kubeconfig, node.name, node.net.address)
        path = node.folder / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self._run_in(node, "kube-proxy", [str(cluster.bin_dir / "kube-proxy"), f"--config={path}", "--v=1"])

    def _stop_node(self, node: RealNode) -> None:
        for name in ("kubelet", "kube-proxy"):
            if name in node.components:
                node.components[name].stop(grace=5)
        containerd = node.components.get("containerd")
        if containerd is not None and containerd.alive():
            with contextlib.suppress(HarnessError, subprocess.TimeoutExpired):
                kill_containers(node)
            containerd.stop(grace=5)
        if node.holder is not None:
            kill_namespace_members(node)
            node.holder.stop(grace=2)
        kill_container_cgroups(node)
        # A mount point made here is removed only while no other cluster's node may mount on it
        # (removing a directory detaches the mounts other namespaces have on it).
        if not self._other_clusters():
            for path in sorted(node.created_mountpoints, key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    path.rmdir()
        shutil.rmtree(node.folder, ignore_errors=True)
        self.network.delete_node(node.net)

    def _other_clusters(self) -> bool:
        return any(not ns.startswith(self.network.prefix + "-") for ns in netns.cluster_namespaces())
