"""The real nodes' network: namespaces the harness makes and removes, nothing routed off the machine.

Layout (``<p>`` is a short prefix unique to one cluster, e.g. ``gsh3f2a``)::

    host namespace        127.0.0.1 only: the API server, etcd, controllers; forwarders
    <p>-net               the "underlay": bridge <p>br, 10.200.0.1/24; the API server is
                          offered here by a forwarder, CoreDNS serves here
    <p>-n0, <p>-n1 ...    one per real node: eth0 10.200.0.(10+i)/24 on that bridge;
                          containerd's CNI bridge cni0 with pods in 10.244.i.0/24

Each node routes the other nodes' pod ranges through their eth0 address, and the underlay
routes every pod range back, so pods on different nodes reach each other; no namespace has a
default route to anything outside. Removing a namespace removes its links and addresses.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .processes import Component, HarnessError

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
UNDERLAY = "10.200.0"
GATEWAY = f"{UNDERLAY}.1"
POD_RANGE = "10.244.0.0/16"
SERVICE_RANGE = "10.96.0.0/16"
DNS_SERVICE_IP = "10.96.0.10"


def ip(*args: str, ns: str | None = None) -> str:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise HarnessError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")
    return proc.stdout


def in_ns(ns: str, *argv: str) -> list[str]:
    """``argv`` run in network namespace ``ns`` only (the mount namespace stays the caller's)."""
    return ["nsenter", f"--net={NETNS_DIR / ns}", "--", *argv]


def sysctl(ns: str, name: str, value: str) -> None:
    subprocess.run(in_ns(ns, "sysctl", "-qw", f"{name}={value}"), check=True, capture_output=True)


@contextlib.contextmanager
def entered(ns: str) -> Iterator[None]:
    """This thread inside network namespace ``ns`` for the block (sockets made here stay there)."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(NETNS_DIR / ns, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise HarnessError(f"cannot enter network namespace {ns}: {os.strerror(ctypes.get_errno())}")
        try:
            yield
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:  # pragma: no cover - the kernel refused the way back
                raise HarnessError(f"cannot leave network namespace {ns}")
    finally:
        os.close(own)
        os.close(target)


def listening_socket(host: str, port: int, ns: str | None = None) -> socket.socket:
    """A TCP socket listening on ``host:port`` inside ``ns`` (the host's namespace if None),
    inheritable, for a forwarder process to accept on."""
    with entered(ns) if ns else contextlib.nullcontext():
        sock = socket.create_server((host, port), reuse_port=False)
    sock.set_inheritable(True)
    return sock


FORWARD = ("-m", "gpushare_hub.localcluster.forward")


def start_forwarder(
    name: str, sock: socket.socket, target: str, log: Path, ns: str | None = None
) -> Component:
    """A forwarder (:mod:`.forward`) accepting on ``sock`` (made in whichever namespace it must
    serve) and connecting to ``target`` from ``ns`` (the host's namespace if None). ``sock`` is
    the forwarder's from then on (closed here)."""
    argv = [sys.executable, *FORWARD, f"--listen-fd={sock.fileno()}", f"--to={target}"]
    comp = Component(name, in_ns(ns, *argv) if ns else argv, log, pass_fds=(sock.fileno(),))
    try:
        comp.start()
    finally:
        sock.close()
    return comp


def start_egress_proxy(socket_path: Path, log: Path, ns: str) -> Component:
    """The HTTP CONNECT proxy (:mod:`.forward`) on a Unix socket, dialling from ``ns``."""
    argv = [sys.executable, *FORWARD, "--http-connect", f"--listen-unix={socket_path}"]
    return Component("egress-proxy", in_ns(ns, *argv), log).start()


@dataclass(frozen=True)
class NodeNet:
    name: str  # the Kubernetes node name
    ns: str
    address: str  # eth0 on the underlay
    pod_subnet: str
    pod_gateway: str


class Network:
    """The underlay namespace and one namespace per real node."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.underlay = f"{prefix}-net"
        self.bridge = f"{prefix}br"
        self.nodes: list[NodeNet] = []

    def create(self) -> Network:
        ip("netns", "add", self.underlay)
        ip("link", "set", "lo", "up", ns=self.underlay)
        ip("link", "add", self.bridge, "type", "bridge", ns=self.underlay)
        ip("addr", "add", f"{GATEWAY}/24", "dev", self.bridge, ns=self.underlay)
        ip("link", "set", self.bridge, "up", ns=self.underlay)
        sysctl(self.underlay, "net.ipv4.ip_forward", "1")
        return self

    def add_node(self, name: str) -> NodeNet:
        i = len(self.nodes)
        node = NodeNet(
            name=name,
            ns=f"{self.prefix}-n{i}",
            address=f"{UNDERLAY}.{10 + i}",
            pod_subnet=f"10.244.{i}.0/24",
            pod_gateway=f"10.244.{i}.1",
        )
        ip("netns", "add", node.ns)
        self.nodes.append(node)  # recorded at once: deleted even if the rest of the set-up fails
        ip("link", "set", "lo", "up", ns=node.ns)
        host_end = f"{self.prefix}v{i}"
        ip(
            "link",
            "add",
            host_end,
            "netns",
            self.underlay,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            node.ns,
        )
        ip("link", "set", host_end, "master", self.bridge, "up", ns=self.underlay)
        ip("addr", "add", f"{node.address}/24", "dev", "eth0", ns=node.ns)
        ip("link", "set", "eth0", "up", ns=node.ns)
        # Service addresses leave a node only after kube-proxy rewrote them; the rest of the
        # cluster's ranges go through the underlay. No default route: nothing else exists.
        ip("route", "add", SERVICE_RANGE, "dev", "eth0", ns=node.ns)
        for other in self.nodes[:-1]:
            ip("route", "add", other.pod_subnet, "via", other.address, ns=node.ns)
            ip("route", "add", node.pod_subnet, "via", node.address, ns=other.ns)
        ip("route", "add", node.pod_subnet, "via", node.address, ns=self.underlay)
        sysctl(node.ns, "net.ipv4.ip_forward", "1")
        with contextlib.suppress(subprocess.CalledProcessError):  # absent without br_netfilter
            sysctl(node.ns, "net.bridge.bridge-nf-call-iptables", "1")
        return node

    def delete_node(self, node: NodeNet) -> None:
        """The node's namespace (its links, addresses, iptables rules) and the routes to it."""
        subprocess.run(["ip", "netns", "delete", node.ns], capture_output=True)
        for ns in [n.ns for n in self.nodes if n is not node] + [self.underlay]:
            subprocess.run(["ip", "-n", ns, "route", "del", node.pod_subnet], capture_output=True)
        self.nodes = [n for n in self.nodes if n is not node]

    def delete(self) -> None:
        for ns in [n.ns for n in self.nodes] + [self.underlay]:
            if (NETNS_DIR / ns).exists():
                subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


def cluster_namespaces(prefix_start: str = "gsh") -> list[str]:
    """The network namespaces of local clusters on this machine, running or left by a killed
    harness (their names start with ``gsh``, or with one cluster's prefix)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix_start))
