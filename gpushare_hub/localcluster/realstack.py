"""The whole product on real nodes: our chart and Zero to JupyterHub running as containers.

``gpushare-localcluster up --real-nodes N --z2jh --ready-file PATH`` runs this: a local control
plane with N real nodes (:mod:`.realnodes`), our images and the images the charts name imported
into each node's containerd, the gpushare-hub chart installed with ``helm install`` (simulated
cards, ``devicePlugin.simulate``), then Zero to JupyterHub 4.4.0 with ``examples/z2jh-values.yaml``
and ``examples/z2jh-small-cluster-values.yaml``. The hub is forwarded to 127.0.0.1.

It needs a checkout of this repository (the images are built from ``images/``, the charts and
example values are read from it) and, for ``--z2jh``, Zero to JupyterHub's chart unpacked
(``helm pull jupyterhub/jupyterhub --version 4.4.0 --untar``; tests use the copy in
``../shared/vendor``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from .cluster import LocalCluster
from .processes import HarnessError
from .realnodes import RealNodes
from .registry import LocalRegistry

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpushare-hub"
EXAMPLES = ROOT / "examples"
Z2JH_VERSION = "4.4.0"
GPUSHARE_NAMESPACE = "gpushare-hub"
HUB_NAMESPACE = "jupyterhub"
# The cards each real node declares (the device plugin's simulated backend).
SIMULATED_CARDS = "2x Tesla T4:15360"
# Where the hub's database lives on the node that holds it (examples/hub-db-pv.yaml).
HUB_DB_PATH = "/var/lib/jupyterhub/hub-db"
HUB_UID = 1000  # Zero to JupyterHub's hub.containerSecurityContext.runAsUser


def images_module() -> ModuleType:
    """``images/build.py`` of this checkout (it is not part of the installed package)."""
    path = ROOT / "images" / "build.py"
    if not path.exists():
        raise HarnessError(
            f"real nodes build their images from a checkout of gpushare-hub ({path} is missing): "
            "run from a clone with `pip install -e .`"
        )
    spec = importlib.util.spec_from_file_location("gpushare_images_build", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def release_module() -> ModuleType:
    """``release/publish.py`` of this checkout: the release's own steps (it imports
    ``release/version.py`` beside it)."""
    folder = ROOT / "release"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("gpushare_release_publish", folder / "publish.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def publish(registry: LocalRegistry, helm: Path) -> tuple[dict[str, str], dict[str, str]]:
    """A release in ``registry``, as the release workflow publishes one to ghcr.io and by its own
    steps (``release/publish.py``): our images under ``gpushare-hub/`` and the chart as
    ``oci://<registry>/gpushare-hub/charts/gpushare-hub``; beside them the other images a node
    runs, each under its own name's path (``pause``, ``kube-scheduler``,
    ``jupyterhub/configurable-http-proxy``), as their registries serve them. Every image is built
    where missing. Returns each image's name as pods name it and its buildah reference, by role."""
    images = images_module()
    builder = images.Builder()
    try:
        refs = images.node_images(builder)
        names = images.chart_names()
        release = release_module()
        release.push_images(f"{registry.address}/gpushare-hub", True, refs=refs)
        for role in refs.keys() - release.REPOSITORIES.keys():
            path = names[role].split("/", 1)[1]
            builder.buildah("push", "--tls-verify=false", refs[role], f"docker://{registry.address}/{path}")
        release.push_chart(f"{registry.address}/gpushare-hub", True, str(helm))
    except (images.BuildError, subprocess.CalledProcessError) as err:
        raise HarnessError(f"publishing the real nodes' images and chart failed: {err}") from err
    return names, refs


def default_z2jh_chart() -> Path:
    return ROOT.parent / "shared" / "vendor" / f"zero-to-jupyterhub-k8s-{Z2JH_VERSION}" / "jupyterhub"


class RealStack:
    """A running cluster with real nodes, and the two charts installed on it on request."""

    def __init__(
        self,
        cluster: LocalCluster,
        images: tuple[dict[str, str], dict[str, str]],
        nodes: RealNodes,
        registry: LocalRegistry,
    ) -> None:
        self.cluster = cluster
        self.names, self.refs = images  # role -> the name pods give it, its buildah reference
        self.nodes = nodes
        self.registry = registry
        self.helm = cluster.bin_dir / "helm"
        self.kubectl = cluster.bin_dir / "kubectl"
        self.hub_url = ""
        self.admin_token = ""

    @classmethod
    def start(cls, cluster: LocalCluster, count: int) -> RealStack:
        """Real nodes on a started ``cluster`` (made with ``real_nodes=True``) and a release in the
        cluster's own registry (:func:`publish`), which the nodes pull every image from."""
        registry = LocalRegistry(cluster.workdir / "registry").__enter__()
        cluster.on_stop(lambda: registry.__exit__(None, None, None))
        helm = cluster.bin_dir / "helm"
        names, refs = publish(registry, helm)
        nodes = RealNodes(cluster, registry.address, sandbox_image=names["pause"])
        nodes.add(count)
        return cls(cluster, (names, refs), nodes, registry)

    @property
    def chart(self) -> str:
        """The published chart, as ``helm install`` names it (``--plain-http``: the registry speaks HTTP)."""
        return f"oci://{self.registry.address}/gpushare-hub/charts/gpushare-hub"

    def publish_upgrade(self, version: str) -> dict[str, str]:
        """A later release in the registry: the chart at ``version`` (its appVersion too) and the
        extender's and device plugin's images rebuilt under that tag (a label that says the version,
        so each is a new image with its own digest). The names pushed, by role."""
        builder = images_module().Builder()
        refs = {}
        for role in ("extender", "device-plugin"):
            made = builder.buildah("from", "--pull=never", self.refs[role], capture=True)
            ctr = made.strip().splitlines()[-1]
            try:
                builder.buildah("config", f"--label=org.opencontainers.image.version={version}", ctr)
                refs[role] = builder.buildah("commit", "--quiet", ctr, capture=True).strip().splitlines()[-1]
            finally:
                builder.buildah("rm", ctr)
        release = release_module()
        ours = f"{self.registry.address}/gpushare-hub"
        pushed: dict[str, str] = release.push_images(ours, True, tag=version, refs=refs)
        release.push_chart(ours, True, str(self.helm), chart_version=version)
        return pushed

    # ---- commands ---------------------------------------------------------------------
    def run(self, program: str, *args: str, timeout: float = 600) -> str:
        binary = {"helm": self.helm, "kubectl": self.kubectl}[program]
        env = dict(os.environ, KUBECONFIG=str(self.cluster.kubeconfig))
        proc = subprocess.run(
            [str(binary), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode != 0:
            raise HarnessError(
                f"`{program} {' '.join(args)}` failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
            )
        return proc.stdout

    # ---- our chart ----------------------------------------------------------------------
    def gpushare_install_argvs(self) -> list[list[str]]:
        """README.md's install commands on GPU Operator nodes (label the nodes, the hub's namespace,
        ``helm install`` of the published chart with the NVIDIA runtime class), here from the
        cluster's own registry, with what a cluster without GPUs whose registry speaks plain HTTP
        adds: ``--plain-http`` and simulated cards (docs/install.md's "Try the chart without GPUs";
        the node tier checks that they agree)."""
        version = images_module().package_version()
        return [
            ["kubectl", "label", "node", *self.nodes.nodes, "gpushare=true",
             "nvidia.com/gpu.deploy.device-plugin=false", "--overwrite"],
            ["kubectl", "create", "namespace", HUB_NAMESPACE],
            ["helm", "install", "gpushare-hub", self.chart, "--version", version,
             "--namespace", GPUSHARE_NAMESPACE, "--create-namespace",
             "--set", f"hub.serviceAccount.namespace={HUB_NAMESPACE}",
             "--set", "devicePlugin.runtimeClassName=nvidia",
             "--set", "devicePlugin.driverRoot=/run/nvidia/driver", "--wait",
             "--plain-http", "--set-string", f"devicePlugin.simulate={SIMULATED_CARDS}"],
        ]  # fmt: skip

    def install_gpushare(self) -> None:
        *before, install = self.gpushare_install_argvs()
        for argv in before:
            self.run(argv[0], *argv[1:])
        self.run(install[0], *install[1:], "--timeout=8m")

    # ---- Zero to JupyterHub -------------------------------------------------------------
    def prepare_hub_volume(self, node: str) -> None:
        """The hub database's folder on ``node`` (owned by the hub's user) and its PersistentVolume."""
        folder = self.nodes.host_path(node, HUB_DB_PATH)
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, HUB_UID, HUB_UID)
        self.run("kubectl", "apply", f"--filename={self.hub_volume_manifest(node)}")

    def hub_volume_manifest(self, node: str) -> Path:
        text = (EXAMPLES / "hub-db-pv.yaml").read_text().replace("<hub-node>", node)
        path = self.cluster.workdir / "hub-db-pv.yaml"
        path.write_text(text)
        return path

    def local_values(self) -> Path:
        """The local cluster's own Zero to JupyterHub values: the configurable-http-proxy image it
        built, and an admin API token (a hub service with an admin role) for the ready file."""
        self.admin_token = secrets.token_hex(32)
        chp_name, chp_tag = self.names["chp"].rsplit(":", 1)
        values = {
            "proxy": {"chp": {"image": {"name": chp_name, "tag": chp_tag}}},
            "hub": {
                "services": {"gpushare-localcluster": {"apiToken": self.admin_token}},
                "loadRoles": {
                    "gpushare-localcluster": {
                        "services": ["gpushare-localcluster"],
                        "scopes": [
                            "admin:users",
                            "admin:servers",
                            "access:servers",
                            "read:hub",
                            "tokens",
                            # The gpushare hub service (configure_hub): its API and dashboard.
                            "access:services",
                            "custom:gpushare:admin",
                        ],
                    }
                },
            },
        }
        path = self.cluster.workdir / "z2jh-localcluster-values.yaml"
        path.write_text(yaml.safe_dump(values))
        path.chmod(0o600)
        return path

    def z2jh_install_argv(self, chart: str) -> list[str]:
        """``helm upgrade --install`` of Zero to JupyterHub as docs/zero-to-jupyterhub.md's "On a
        small cluster of your own" writes it, with ``chart`` for ``jupyterhub/jupyterhub``."""
        return [
            "helm", "upgrade", "--install", "jhub", chart, "--namespace", HUB_NAMESPACE, "--create-namespace",
            "--version", Z2JH_VERSION, "--values", "examples/z2jh-values.yaml",
            "--values", "examples/z2jh-small-cluster-values.yaml",
        ]  # fmt: skip

    def install_z2jh(self, chart: Path, extra_values: tuple[str, ...] = ()) -> None:
        """``extra_values``: further values files after the documented ones (e.g. the DRA path's)."""
        if not (chart / "Chart.yaml").exists():
            raise HarnessError(
                f"no Zero to JupyterHub chart at {chart}: unpack it there "
                f"(helm pull jupyterhub/jupyterhub --version {Z2JH_VERSION} --untar) or pass --z2jh-chart"
            )
        node = next(iter(self.nodes.nodes))
        self.prepare_hub_volume(node)
        argv = self.z2jh_install_argv(str(chart))
        extra = [a for path in extra_values for a in ("--values", path)]
        self.run(argv[0], *argv[1:], *extra, "--values", str(self.local_values()), "--wait", "--timeout=8m")
        ip = self.cluster.core_api().read_namespaced_service("proxy-public", HUB_NAMESPACE).spec.cluster_ip
        self.hub_url = "http://" + self.nodes.forward_to_host(f"{ip}:80")
        self.wait_hub()

    def wait_hub(self, timeout: float = 120) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.hub_url}/hub/api/", timeout=5) as resp:
                    if resp.status == 200:
                        return
            except Exception as err:  # the proxy or the hub not answering yet
                last = err
            time.sleep(1)
        raise HarnessError(f"the hub did not answer at {self.hub_url}/hub/api/ in {timeout:.0f}s: {last}")

    def ready_document(self) -> dict[str, Any]:
        return {
            "kubeconfig": str(self.cluster.kubeconfig),
            "hub_url": self.hub_url,
            "admin_token": self.admin_token,
            "namespace": HUB_NAMESPACE,
            "gpushare_namespace": GPUSHARE_NAMESPACE,
            "nodes": list(self.nodes.nodes),
            "logs": str(self.cluster.logs),
        }

    def write_ready_file(self, path: Path) -> None:
        """The ready file, readable by its owner only from its first byte (it holds the admin
        token), written whole or not at all."""
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600, a new file
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(self.ready_document(), indent=2) + "\n")
        os.replace(tmp, path)
