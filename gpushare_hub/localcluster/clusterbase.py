"""What every part of a :class:`~gpushare_hub.localcluster.cluster.LocalCluster` shares: its
folders and binaries, its components and how one is run and stopped, and the admin's access to
the API server (credentials, GET, the ``kubernetes`` client, namespaces, RBAC grants)."""

from __future__ import annotations

import json
import shutil
import ssl
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from ..core.resources import DEFAULT_NAMES, ResourceNames
from . import build
from .pki import PKI, Credential
from .processes import Component, HarnessError

SA_PATH = "/api/v1/namespaces/{ns}/serviceaccounts/default"


def _report_failure(step: Callable[[], None]) -> None:
    try:
        step()
    except Exception as err:  # teardown goes on; the failure is said
        print(f"[localcluster] while stopping: {err!r}", file=sys.stderr)


class ClusterBase:
    """The state of one local cluster; :mod:`.controlplane` starts it, :mod:`.kwoknodes` and
    :mod:`.schedulers` add to it."""

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
    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

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

    # ---- API access ----------------------------------------------------------------------
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

    def _ssl(self) -> ssl.SSLContext:
        assert self._pki is not None and self._admin is not None
        ctx = ssl.create_default_context(cafile=str(self._pki.ca))
        ctx.load_cert_chain(str(self._admin.cert), str(self._admin.key))
        return ctx

    def _get(self, path: str) -> str:
        # 30 s: an API server on a loaded machine (a cold build beside the tests) may stall a few
        # seconds, and one slow answer must not fail the wait it is part of.
        with urllib.request.urlopen(self.server + path, context=self._ssl(), timeout=30) as resp:
            return str(resp.read().decode())

    def get_json(self, path: str) -> Any:
        """GET an API path as the admin and return the JSON exactly as the API server sent it."""
        return json.loads(self._get(path))

    def version(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self._get("/version"))
        return result

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

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A synchronous ``kubernetes`` ApiClient for the admin (or the given kubeconfig)."""
        from kubernetes import config

        return config.new_client_from_config(config_file=str(kubeconfig or self.kubeconfig))

    def core_api(self, kubeconfig: Path | None = None) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client(kubeconfig))
