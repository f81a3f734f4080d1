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
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpushare_hub.plugin.backends import simulated_uuid

from . import build, netns, noderuntime, runtimebuild
from .hostcheck import CNI_BIN, check_host
from .processes import Component, HarnessError

if TYPE_CHECKING:
    from .cluster import LocalCluster

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
# Where the nodes pull images from: the harness's registry, forwarded onto the underlay.
MIRROR = f"{netns.GATEWAY}:5000"
# Machine-wide settings a kubelet writes at start (not per namespace); put back when the nodes stop.
KERNEL_TUNABLES = (
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
COREDNS_RULES = [
    {"apiGroups": [""], "resources": ["services", "pods", "namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
]


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


class RealNodes:
    """The real nodes of one :class:`LocalCluster` (started with ``real_nodes=True``)."""

    def __init__(self, cluster: LocalCluster, registry: str, sandbox_image: str, cards: int = 2) -> None:
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

    @staticmethod
    def host_path_of(node: RealNode, path: str) -> Path:
        path = "/run/" + path[len("/var/run/") :] if path.startswith("/var/run/") else path
        for root in NODE_PATHS:
            if path == root or path.startswith(root + "/"):
                return node.folder / root.strip("/").replace("/", "-") / path[len(root) :].lstrip("/")
        raise HarnessError(f"{path} is not under a node folder ({', '.join(NODE_PATHS)})")

    # ---- shared parts ---------------------------------------------------------------------
    def _start_dns(self) -> None:
        cluster = self.cluster
        cluster.grant("system:coredns", COREDNS_RULES)
        kubeconfig = cluster.credential("coredns", "system:coredns", server=cluster.node_server)
        corefile = cluster.workdir / "Corefile"
        corefile.write_text(
            f""".:53 {{
    bind {netns.GATEWAY}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"""
        )
        binary = runtimebuild.build_coredns()
        self.coredns = Component(
            "coredns",
            netns.in_ns(self.network.underlay, str(binary), "-conf", str(corefile)),
            cluster.logs / "coredns.log",
        ).start()
        core = cluster.core_api()
        core.create_namespaced_service(
            "kube-system",
            {
                "metadata": {"name": "kube-dns", "labels": {"k8s-app": "kube-dns"}},
                "spec": {
                    "clusterIP": netns.DNS_SERVICE_IP,
                    "ports": [
                        {"name": "dns", "port": 53, "protocol": "UDP"},
                        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                    ],
                },
            },
        )
        from kubernetes import client

        slice_body: dict[str, Any] = {
            "metadata": {
                "name": "kube-dns-coredns",
                "labels": {
                    "kubernetes.io/service-name": "kube-dns",
                    "endpointslice.kubernetes.io/managed-by": "gpushare-localcluster",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [netns.GATEWAY], "conditions": {"ready": True}}],
            "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ],
        }
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

        body = {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        }
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
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "gpushare-local",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [
                                    [{"subnet": node.net.pod_subnet, "gateway": node.net.pod_gateway}]
                                ],
                                "routes": [{"dst": "0.0.0.0/0"}],
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                },
                indent=2,
            )
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
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(cluster.pki.ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "address": node.net.address,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "cgroupDriver": "cgroupfs",
            # What makes a kubelet run on this kind of machine (cgroup v1, no systemd, swap).
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "failCgroupV1": False,
            "clusterDNS": [netns.DNS_SERVICE_IP],
            "clusterDomain": "cluster.local",
            "resolvConf": str(resolv),
            "staticPodPath": "",
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "evictionHard": {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%"},
            "nodeStatusReportFrequency": "10s",
            "volumeStatsAggPeriod": "0s",
            "rotateCertificates": False,
            "serverTLSBootstrap": False,
            "registerNode": True,
            "shutdownGracePeriod": "0s",
        }
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
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables",
            "clusterCIDR": netns.POD_RANGE,
            "hostnameOverride": node.name,
            "bindAddress": node.net.address,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # Leave the conntrack table's size and timeouts as the machine has them.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
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
                self._kill_containers(node)
            containerd.stop(grace=5)
        if node.holder is not None:
            self._kill_namespace_members(node)
            node.holder.stop(grace=2)
        self._kill_container_cgroups(node)
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

    def _kill_container_cgroups(self, node: RealNode) -> None:
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

    def _kill_containers(self, node: RealNode) -> None:
        """Every container task killed and deleted (runc removes its cgroups and mounts)."""
        tasks = [line.split()[0] for line in node.ctr("tasks", "ls").splitlines()[1:] if line.strip()]
        for task in tasks:
            node.ctr("tasks", "kill", "--signal=SIGKILL", "--all", task, check=False, timeout=20)
        for task in tasks:
            node.ctr("tasks", "delete", "--force", task, check=False, timeout=30)

    def _kill_namespace_members(self, node: RealNode) -> None:
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
