"""The control plane of a local cluster: etcd, kube-apiserver (RBAC on), kube-controller-manager
and kwok, each started and waited for in turn; with real nodes, the network they join and the
API server offered to them; and the faults the fault tests cause."""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from typing import Self

import yaml

from . import build, netns
from .clusterbase import SA_PATH, ClusterBase
from .hostcheck import check_host
from .kwoknodes import KWOK_NODE_ANNOTATION
from .pki import PKI
from .processes import Component, free_port

# The DRA path's consumable capacity (docs/dra.md): beta and on by default from 1.36, alpha before;
# switched on at every pinned version so that the cluster tier shows the DRA path on the oldest too.
DRA_GATES = "--feature-gates=DRAConsumableCapacity=true"
# kube-controller-manager's controllers the local cluster runs: workloads create pods, deleted
# namespaces empty out, service accounts and their tokens exist, owned objects are collected,
# the aggregated ClusterRoles (admin, edit, view) get their rules, ResourceQuotas are counted
# (admission refuses every pod in a namespace whose quota the controller has not counted yet).
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "daemonset-controller",
    "statefulset-controller",
    "job-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "garbage-collector-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "resourcequota-controller",
    # A pod's ResourceClaim from its template (the DRA path, docs/dra.md).
    "resourceclaim-controller",
)
# With real nodes: Services get EndpointSlices (kube-proxy and CoreDNS read them), and claims
# bind to the PersistentVolumes an admin made (Zero to JupyterHub's hub database).
REAL_NODE_CONTROLLERS = (
    "endpointslice-controller",
    "persistentvolume-binder-controller",
    # A claim or volume in use is deleted only once its pods are gone (their finalizers).
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
)


class ControlPlane(ClusterBase):
    """``start``: the control plane, in order; stopped on failure."""

    def start(self) -> Self:
        try:
            if self.real_nodes:
                self._make_network()
            self._start_etcd()
            self._start_apiserver()
            if self.real_nodes:
                self._offer_apiserver_to_nodes()
            self._start_controller_manager()
            self._start_kwok()
        except BaseException:
            self.stop()
            raise
        return self

    # ---- components --------------------------------------------------------------------
    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        comp = self._run(
            "etcd",
            [
                self._bin("etcd"),
                "--name=local",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                f"--initial-cluster=local=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )
        comp.wait_until(
            lambda: urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2).status == 200, 60, "healthy"
        )

    def _start_apiserver(self) -> None:
        pki = self._pki = PKI(self.workdir / "pki")
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        serving = pki.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            hosts=(
                "127.0.0.1",
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "10.96.0.1",
                *((netns.GATEWAY,) if self.real_nodes else ()),
            ),
        )
        self._admin = pki.issue("admin", "gpushare-admin", "system:masters")
        sa_key, sa_pub = pki.service_account_keys()
        self._sa_key = sa_key
        self.kubeconfig = pki.kubeconfig("admin", self.server, self._admin)
        comp = self._run(
            "kube-apiserver",
            [
                self._bin("kube-apiserver"),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                f"--advertise-address={netns.GATEWAY if self.real_nodes else '127.0.0.1'}",
                # kwok's simulated nodes run no pod that would call the `kubernetes` Service, and
                # from v1.35 on the API server refuses a loopback address as that Service's endpoint.
                *(() if self.real_nodes else ("--endpoint-reconciler-type=none",)),
                f"--secure-port={port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={pki.ca}",
                f"--service-account-key-file={sa_pub}",
                f"--service-account-signing-key-file={sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=Node,RBAC",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                # The node-lifecycle controller (not run) would be the one to lift the not-ready
                # taint that `TaintNodesByCondition` puts on every new node.
                "--disable-admission-plugins=TaintNodesByCondition",
                "--profiling=false",
                "--v=1",
                DRA_GATES,
                *self._real_node_flags(),
            ],
        )
        comp.wait_until(lambda: self._get("/readyz") == "ok", 120, "ready (/readyz)")

    # ---- the real nodes' side of the control plane -------------------------------------------
    def _make_network(self) -> None:
        check_host()
        prefix = f"gsh{os.getpid() % 100000:05d}"
        self.network = netns.Network(prefix)  # kept first: deleted on stop even if create() fails
        self.network.create()

    def _real_node_flags(self) -> list[str]:
        """The API server reaches kubelets (logs, exec) through an HTTP CONNECT proxy on a Unix
        socket that runs in the nodes' underlay namespace, by their InternalIP."""
        if not self.real_nodes:
            return []
        assert self._pki is not None
        self.egress_socket = self.workdir / "egress.sock"
        egress = self.workdir / "egress-selector.yaml"
        egress.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "apiserver.k8s.io/v1beta1",
                    "kind": "EgressSelectorConfiguration",
                    "egressSelections": [
                        {
                            "name": "cluster",
                            "connection": {
                                "proxyProtocol": "HTTPConnect",
                                "transport": {"uds": {"udsName": str(self.egress_socket)}},
                            },
                        }
                    ],
                }
            )
        )
        client = self._pki.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"
        )
        return [
            f"--egress-selector-config-file={egress}",
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={client.cert}",
            f"--kubelet-client-key={client.key}",
        ]

    def _offer_apiserver_to_nodes(self) -> None:
        """A forwarder from 10.200.0.1:<port> in the underlay to the API server on 127.0.0.1, and the
        egress proxy the API server dials kubelets through."""
        port = int(self.server.rsplit(":", 1)[1])
        self.node_server = f"https://{netns.GATEWAY}:{port}"
        sock = netns.listening_socket(netns.GATEWAY, port, ns=self.network.underlay)
        log = self.logs / "apiserver-forward.log"
        comp = netns.start_forwarder("apiserver-forward", sock, f"127.0.0.1:{port}", log)
        self.components[comp.name] = comp
        comp = netns.start_egress_proxy(
            self.egress_socket, self.logs / "egress-proxy.log", self.network.underlay
        )
        self.components[comp.name] = comp
        comp.wait_until(self.egress_socket.exists, 20, "serving the API server's egress socket")

    # ---- faults (the fault tests) ---------------------------------------------------------
    @property
    def apiserver(self) -> Component:
        return self.components["kube-apiserver"]

    def kill_apiserver(self) -> None:
        """SIGKILL the API server, as a crash or a node failure would; etcd keeps the data."""
        self.apiserver.kill()

    def start_apiserver_again(self, timeout: float = 120) -> None:
        """Start the killed API server with the same flags and port; wait until it is ready."""
        comp = self.apiserver.start()
        comp.wait_until(lambda: self._get("/readyz") == "ok", timeout, "ready again (/readyz)")

    def freeze(self, name: str) -> None:
        """SIGSTOP a component: it holds its connections open and answers nothing."""
        self.components[name].signal(signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        self.components[name].signal(signal.SIGCONT)

    def _start_controller_manager(self) -> None:
        """The controllers that make workloads and service accounts real (not the node lifecycle:
        kwok keeps the simulated nodes' status). Each controller acts as its own service
        account, as kubeadm sets it up, so its RBAC is the bootstrap policy's."""
        assert self._pki is not None
        port = free_port()
        kubeconfig = self.credential("controller-manager", "system:kube-controller-manager")
        comp = self._run(
            "kube-controller-manager",
            [
                self._bin("kube-controller-manager"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--controllers=" + ",".join(CONTROLLERS + (REAL_NODE_CONTROLLERS if self.real_nodes else ())),
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self._sa_key}",
                f"--root-ca-file={self._pki.ca}",
                "--leader-elect=false",
                DRA_GATES,
                "--v=1",
            ],
        )
        comp.port = port
        # Ready when the service-account controller has given the `default` namespace its
        # ServiceAccount: the `ServiceAccount` admission plugin refuses pods until then.
        comp.wait_until(lambda: self.get_json(SA_PATH.format(ns="default")) is not None, 120, "ready")

    def _start_kwok(self) -> None:
        stages = build.kwok_stages_file(self.bin_dir)
        comp = self._run(
            "kwok",
            [
                self._bin("kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
                "--cidr=10.240.0.0/16",
                "--node-ip=10.239.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{free_port()}",
            ],
        )
        time.sleep(0.5)
        comp.wait_until(lambda: True, 5, "running")
