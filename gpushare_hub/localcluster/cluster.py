"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler(s), kwok.

Usage::

    with LocalCluster() as cluster:              # builds nothing; see build.py
        cluster.start()                          # etcd, apiserver (RBAC on), controllers, kwok
        cluster.start_scheduler()                # the default scheduler
        cluster.start_scheduler("gpushare-scheduler", extenders=[...])
        cluster.add_gpu_nodes(3, cards=2)        # kwok nodes with aliyun.com/gpu-mem
        api = cluster.core_api()

Every port is chosen free at start; every process is stopped on exit, after an
exception too; each component's log stays in ``cluster.workdir / "logs"``.
"""

from __future__ import annotations

import json
import shutil
import signal
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from gpushare_hub.core.names import CARDS_ANNOTATION

from ..core.cards import Card, cards_to_annotation, declared_cards
from ..core.resources import DEFAULT_NAMES, ResourceNames
from . import build, netns
from .pki import PKI, Credential
from .processes import Component, HarnessError, free_port

# The DRA path's consumable capacity (docs/dra.md): beta and on by default from 1.36, alpha before;
# switched on at every pinned version so that the cluster tier shows the DRA path on the oldest too.
DRA_GATES = "--feature-gates=DRAConsumableCapacity=true"

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
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
SA_PATH = "/api/v1/namespaces/{ns}/serviceaccounts/default"


def _report_failure(step: Callable[[], None]) -> None:
    try:
        step()
    except Exception as err:  # teardown goes on; the failure is said
        print(f"[localcluster] while stopping: {err!r}", file=sys.stderr)


class LocalCluster:
    """One local control plane. Not thread-safe; one per test session is plenty."""

    def __init__(
        self,
        workdir: Path | None = None,
        bin_dir: Path | None = None,
        names: ResourceNames = DEFAULT_NAMES,
        keep_workdir: bool = False,
        real_nodes: bool = False,
    ) -> None:
        """``real_nodes``: make the network namespaces real nodes join (:mod:`.realnodes`):
        the API server is then also offered at 10.200.0.1 and reaches kubelets through them."""
        self.real_nodes = real_nodes
        self.network: Any = None  # netns.Network, with real nodes
        self.node_server = ""  # the API server as nodes and pods reach it
        self.bin_dir = bin_dir or build.bin_dir()
        missing = [b for b in build.GROUPS["control-plane"] if not (self.bin_dir / b).exists()]
        if missing:
            raise HarnessError(
                f"missing {', '.join(missing)} in {self.bin_dir}; run `gpushare-localcluster build` first"
            )
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="gpushare-localcluster-"))
        self.keep_workdir = keep_workdir
        self.names = names
        self.logs = self.workdir / "logs"
        self.components: dict[str, Component] = {}
        self.server = ""
        self.kubeconfig = Path()
        self._pki: PKI | None = None
        self._admin: Credential | None = None
        self._sa_key = Path()
        self._cleanups: list[Callable[[], None]] = []
        self._first_cleanups: list[Callable[[], None]] = []

    # ---- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> LocalCluster:
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

    def stop(self) -> None:
        """Everything, in order; a step that fails is reported and the next ones still run."""
        first, self._first_cleanups = self._first_cleanups, []
        for cleanup in reversed(first):  # real nodes, while the control plane still runs
            _report_failure(cleanup)
        for comp in reversed(list(self.components.values())):
            _report_failure(comp.stop)
        later, self._cleanups = self._cleanups, []
        for cleanup in reversed(later):
            _report_failure(cleanup)
        if self.network is not None:
            _report_failure(self.network.delete)
            self.network = None
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def on_stop_first(self, cleanup: Callable[[], None]) -> None:
        """Run ``cleanup`` first when the cluster stops, before any component (real nodes)."""
        self._first_cleanups.append(cleanup)

    def on_stop(self, cleanup: Callable[[], None]) -> None:
        """Run ``cleanup`` when the cluster stops, after its components (e.g. to stop what they left)."""
        self._cleanups.append(cleanup)

    def log_paths(self) -> dict[str, Path]:
        """Each component's log, and every other log in the logs folder (notebooks, plugins)."""
        paths = {name: comp.log for name, comp in self.components.items()}
        for path in sorted(self.logs.glob("*.log")):
            paths.setdefault(path.stem, path)
        return paths

    def _bin(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _run(self, name: str, argv: list[str]) -> Component:
        comp = Component(name, argv, self.logs / f"{name}.log").start()
        self.components[name] = comp
        return comp

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
        import os

        from .realnodes import check_host

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

    def create_namespace(self, name: str, timeout: float = 120) -> None:
        """Create a namespace and wait for its `default` ServiceAccount (pods need it).

        As long as the controller manager's own start: after the fault tests restart the API
        server, its informers can sit in their watch backoff (seen: over 60 s on v1.36)."""
        self.core_api().create_namespace({"metadata": {"name": name}})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.get_json(SA_PATH.format(ns=name))
                return
            except urllib.error.HTTPError as err:
                if err.code != 404:
                    raise
            time.sleep(0.1)
        raise HarnessError(
            f"namespace {name} got no default ServiceAccount in {timeout:.0f}s; "
            f"log {self.components['kube-controller-manager'].log}"
        )

    def _ssl(self) -> ssl.SSLContext:
        assert self._pki is not None and self._admin is not None
        ctx = ssl.create_default_context(cafile=str(self._pki.ca))
        ctx.load_cert_chain(str(self._admin.cert), str(self._admin.key))
        return ctx

    def _get(self, path: str) -> str:
        with urllib.request.urlopen(self.server + path, context=self._ssl(), timeout=5) as resp:
            return str(resp.read().decode())

    def get_json(self, path: str) -> Any:
        """GET an API path as the admin and return the JSON exactly as the API server sent it."""
        return json.loads(self._get(path))

    def version(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self._get("/version"))
        return result

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

    def credential(self, name: str, user: str, groups: Iterable[str] = (), server: str = "") -> Path:
        """A kubeconfig for ``user`` (client certificate; groups become Organisation), for
        ``server`` (default: the API server on 127.0.0.1; real nodes: :attr:`node_server`)."""
        assert self._pki is not None
        org = ",".join(groups) or None
        cred = self._pki.issue(name, user, org)
        return self._pki.kubeconfig(name, server or self.server, cred)

    @property
    def pki(self) -> PKI | None:
        return self._pki

    def start_scheduler(
        self,
        scheduler_name: str = "default-scheduler",
        extenders: list[Mapping[str, Any]] | None = None,
        extra: Mapping[str, Any] | None = None,
        profile: Mapping[str, Any] | None = None,
        replica: str = "",
    ) -> Component:
        """Run a kube-scheduler whose one profile is ``scheduler_name``, with optional extenders.

        ``replica`` tells apart several processes of one scheduler (leader election tests).
        """
        port = free_port()
        instance = f"{scheduler_name}-{replica}" if replica else scheduler_name
        kubeconfig = self.credential(f"scheduler-{scheduler_name}", "system:kube-scheduler")
        config: dict[str, Any] = {
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "leaderElection": {"leaderElect": False},
            "profiles": [dict(profile or {}, schedulerName=scheduler_name)],
        }
        if extenders:
            config["extenders"] = list(extenders)
        for key, value in (extra or {}).items():
            if isinstance(value, Mapping) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}  # e.g. clientConnection: {qps: ...}
            else:
                config[key] = value
        cfg = self.workdir / f"scheduler-{instance}.yaml"
        cfg.write_text(yaml.safe_dump(config))
        comp = self._run(
            f"kube-scheduler-{instance}",
            [
                self._bin("kube-scheduler"),
                f"--config={cfg}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                DRA_GATES,
                "--v=2",
            ],
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE

        def healthy() -> bool:
            url = f"https://127.0.0.1:{port}/healthz"
            with urllib.request.urlopen(url, context=insecure, timeout=2) as resp:
                return bool(resp.status == 200)

        comp.wait_until(healthy, 60, "healthy (/healthz)")
        return comp

    def grant(self, user: str, rules: list[dict[str, Any]]) -> None:
        """A ClusterRole named after ``user`` with ``rules``, bound to that user (idempotent)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        from gpushare_hub.extender.rbac import cluster_role, cluster_role_binding

        rbac = client.RbacAuthorizationV1Api(self.api_client())
        subject = {"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}
        calls: list[tuple[Any, Any]] = [
            (rbac.create_cluster_role, cluster_role(user, rules)),
            (rbac.create_cluster_role_binding, cluster_role_binding(subject, user)),
        ]
        for create, body in calls:
            try:
                create(body)
            except ApiException as err:
                if err.status != 409:
                    raise

    def start_extender(
        self,
        policy: str = "binpack",
        name: str = "gpushare-extender",
        port: int | None = None,
        extra_args: Iterable[str] = (),
        log_level: str = "DEBUG",
        https: bool = False,
    ) -> Component:
        """Run ``gpushare-extender`` as its own user, bound to the extender's ClusterRole.

        ``comp.url``: the verbs and /inspect; ``comp.metrics_url``: /metrics, /healthz, /readyz.
        """
        import sys

        from gpushare_hub.extender.rbac import RULES

        self.grant("gpushare-extender", RULES)
        kubeconfig = self.credential(f"user-{name}", "gpushare-extender")
        port = port or free_port()
        metrics_port = free_port()
        comp = self._run(
            name,
            [
                sys.executable,
                "-m",
                "gpushare_hub.extender.app",
                f"--kubeconfig={kubeconfig}",
                "--ip=127.0.0.1",
                f"--port={port}",
                f"--metrics-port={metrics_port}",
                f"--policy={policy}",
                f"--log-level={log_level}",
                *extra_args,
            ],
        )
        comp.port = port
        comp.url = f"{'https' if https else 'http'}://127.0.0.1:{port}"
        comp.metrics_url = f"http://127.0.0.1:{metrics_port}"

        def ready() -> bool:
            with urllib.request.urlopen(f"{comp.metrics_url}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)

        comp.wait_until(ready, 60, "ready (/readyz)")
        return comp

    def start_gpushare_scheduler(
        self, policy: str = "binpack", scheduler_name: str = "gpushare-scheduler"
    ) -> tuple[Component, Component]:
        """The extender, then a dedicated scheduler ``scheduler_name`` that calls it."""
        from gpushare_hub.extender.schedconfig import extender_entry, profile

        ext = self.start_extender(policy)
        sched = self.start_scheduler(
            scheduler_name,
            extenders=[
                extender_entry(
                    f"{ext.url}/gpushare-scheduler", self.names.memory, count_resource=self.names.count
                )
            ],
            profile=profile(scheduler_name, self.names.memory, policy),
        )
        return ext, sched

    # ---- API access and objects ---------------------------------------------------------
    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A synchronous ``kubernetes`` ApiClient for the admin (or the given kubeconfig)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def core_api(self, kubeconfig: Path | None = None) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client(kubeconfig))

    def node_object(
        self,
        name: str,
        cards: Iterable[Card],
        cpu: str = "32",
        memory: str = "128Gi",
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """A kwok-managed Node carrying our resources and card inventory, as the plugin would."""
        cards = tuple(cards)
        units = sum(c.units for c in cards)
        resources = {
            "cpu": cpu,
            "memory": memory,
            "pods": "110",
            self.names.memory: str(units),
            self.names.count: str(len(cards)),
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "gpushare": "true",
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **(labels or {}),
                },
                "annotations": {
                    KWOK_NODE_ANNOTATION: "fake",
                    "node.alpha.kubernetes.io/ttl": "0",
                    CARDS_ANNOTATION: cards_to_annotation(cards),
                },
            },
            "status": {"capacity": resources, "allocatable": resources},
        }

    def add_node(self, name: str, cards: Iterable[Card], **kw: Any) -> dict[str, Any]:
        body = self.node_object(name, cards, **kw)
        self.core_api().create_node(body)
        return body

    def add_gpu_nodes(
        self,
        count: int,
        cards: int = 2,
        model: str = "Tesla T4",
        mib: int = 15360,
        prefix: str = "gpu-",
        start: int = 1,
        wait: bool = True,
        **kw: Any,
    ) -> list[str]:
        """``count`` kwok nodes with ``cards`` identical cards each; waits until they are Ready."""
        names = [f"{prefix}{i}" for i in range(start, start + count)]
        for name in names:
            self.add_node(name, declared_cards(name, cards, model, mib, self.names), **kw)
        if wait:
            self.wait_nodes_ready(names)
        return names

    def wait_nodes_ready(self, names: Iterable[str], timeout: float = 120) -> None:
        pending = set(names)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for node in self.get_json("/api/v1/nodes")["items"]:
                conds = (node.get("status") or {}).get("conditions") or []
                if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds):
                    pending.discard(node["metadata"]["name"])
            if pending:
                time.sleep(0.3)
        if pending:
            raise HarnessError(
                f"{len(pending)} node(s) not Ready after {timeout}s (e.g. {sorted(pending)[:3]}); "
                f"kwok log {self.components['kwok'].log}"
            )
