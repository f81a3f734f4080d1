"""Local notebook nodes: kwok nodes with loopback pod IPs, and the node agent that runs their pods.

Usage::

    nodes = NotebookNodes(cluster, images={"gpushare-hub/notebook:local": venv_bin})
    names = nodes.add(2, cards=1)          # nb-1, nb-2: 1x Tesla T4 each, pods on 127.B.N.x
    nodes.start()                          # the agent (and one device plugin per node)
    ...
    nodes.kill_agent(); nodes.start()      # a crash and a restart: running notebooks are adopted

The cluster stops the agent with its other components; anything the agent started that is
still running then (after a crash, say) is stopped too, so no process outlives the harness.
"""

from __future__ import annotations

import os
import random
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpushare_hub.core.names import ALLOCATOR_ANNOTATION, CARDS_ANNOTATION

from ..core.cards import declared_cards
from .cluster import LocalCluster
from .nodeagent import RBAC_RULES, stop_recorded
from .processes import Component, HarnessError

# Nodes that the agent serves carry this label; spawners select them with it.
LABEL = "gpushare-hub.io/local-notebooks"
# Pod IPs of node i are 127.<BASE>.<i>.0/24: every 127.x.y.z answers on Linux without set-up.
LOOPBACK_BASES = range(10, 250)


_TAKEN: set[int] = set()


def free_loopback_base(port: int = 8888) -> int:
    """A second octet B whose pod IPs 127.B.N.x nobody serves yet.

    Two harnesses on one machine (two test runs, a test run beside the demo) must not
    hand out the same pod IPs: a notebook of one would answer the hub of the other.
    """
    candidates = [b for b in LOOPBACK_BASES if b not in _TAKEN]
    random.shuffle(candidates)
    for base in candidates:
        with socket.socket() as probe:
            try:
                probe.bind((f"127.{base}.1.1", port))
            except OSError:
                continue
            _TAKEN.add(base)  # another set of nodes of this process serves none yet
            return base
    raise HarnessError(f"no free loopback range 127.B.1.1:{port} for notebook pods")


NOTEBOOK_IMAGE = "gpushare-hub/notebook:local"


def venv_bin() -> str:
    """The folder of this interpreter's programs: what the notebook image runs from."""
    return str(Path(sys.executable).parent)


def spawner_config(slice_gib: int = 5, scheduler: str = "gpushare-scheduler") -> dict[str, Any]:
    """KubeSpawner options (``c.KubeSpawner.<key> = value``) for notebooks on these nodes."""
    config: dict[str, Any] = {
        "scheduler_name": scheduler,
        "image": NOTEBOOK_IMAGE,
        "cmd": [str(Path(venv_bin()) / "jupyterhub-singleuser")],
        "node_selector": {LABEL: "true"},
        "extra_resource_limits": {"aliyun.com/gpu-mem": str(slice_gib)},
        # Generous: a loaded 2-core machine can take a while to start a notebook server.
        "start_timeout": 300,
        "http_timeout": 300,
    }
    if os.geteuid() == 0:
        # The process runs as the harness's user; a notebook image would run as its own.
        config["args"] = ["--allow-root"]
    return config


class NotebookNodes:
    def __init__(
        self,
        cluster: LocalCluster,
        images: Mapping[str, str] | None = None,
        model: str = "Tesla T4",
        mib: int = 15360,
        plugin_args: Sequence[str] = (),
        name: str = "node-agent",
        label_value: str = "true",
    ) -> None:
        """``plugin_args``: more options for every node's device plugin, e.g.
        ``["--overcommit=2", "--hibernation-host-memory-gib=64"]``; ``name``: the agent's (its
        state folder and process); ``label_value``: the nodes' :data:`LABEL` (another value keeps
        a test's nodes apart from the session's)."""
        self.cluster = cluster
        self.plugin_args = list(plugin_args)
        self.name = name
        self.label_value = label_value
        self.images = dict(images) if images is not None else {NOTEBOOK_IMAGE: venv_bin()}
        self.model = model
        self.mib = mib
        self.nodes: dict[str, str] = {}  # name -> the plugin's --simulate declaration
        self.loopback_base = free_loopback_base()  # pods of node N get IPs 127.<base>.N.x
        self.state_dir = cluster.workdir / name
        self.agent: Component | None = None
        self._restarts = 0
        cluster.on_stop(self._cleanup)

    def add(self, count: int, cards: int = 1, prefix: str = "nb-") -> list[str]:
        """``count`` nodes labelled :data:`LABEL` with ``cards`` cards each; waits until Ready.

        Start (or restart) the agent afterwards: it serves the nodes known when it starts.
        """
        names = []
        for _ in range(count):
            index = len(self.nodes) + 1
            name = f"{prefix}{index}"
            body = self.cluster.node_object(
                name,
                declared_cards(name, cards, self.model, self.mib, self.cluster.names),
                labels={LABEL: self.label_value},
            )
            body["spec"] = {"podCIDR": f"127.{self.loopback_base}.{index}.0/24"}
            # The device plugin publishes the card inventory (its UUIDs) once it registers.
            body["metadata"]["annotations"].pop(CARDS_ANNOTATION)
            self.cluster.core_api().create_node(body)
            self.nodes[name] = f"{cards}x {self.model}:{self.mib}"
            names.append(name)
        self.cluster.wait_nodes_ready(names)
        return names

    def start(self) -> Component:
        if not self.nodes:
            raise HarnessError("add notebook nodes before starting the node agent")
        from gpushare_hub.plugin.kube import RBAC_RULES as PLUGIN_RULES

        self.cluster.grant("gpushare-node-agent", RBAC_RULES)
        self.cluster.grant("gpushare-device-plugin", PLUGIN_RULES)
        agent_kc = self.cluster.credential("user-node-agent", "gpushare-node-agent")
        plugin_kc = self.cluster.credential("user-device-plugin", "gpushare-device-plugin")
        name = self.name if not self._restarts else f"{self.name}-{self._restarts}"
        self._restarts += 1
        argv = [
            sys.executable,
            "-m",
            "gpushare_hub.localcluster.nodeagent",
            f"--kubeconfig={agent_kc}",
            f"--plugin-kubeconfig={plugin_kc}",
            f"--state-dir={self.state_dir}",
            f"--log-dir={self.cluster.logs}",
        ]
        argv += [f"--node={n}={decl}" for n, decl in self.nodes.items()]
        argv += [f"--image={image}={path}" for image, path in self.images.items()]
        argv += [f"--plugin-arg={a}" for a in self.plugin_args]
        self.agent = self.cluster._run(name, argv)
        self.agent.wait_until(self._published, 120, "serving (every node's plugin published its cards)")
        return self.agent

    def _published(self) -> bool:
        nodes = self.cluster.get_json(f"/api/v1/nodes?labelSelector={LABEL}%3D{self.label_value}")["items"]
        ready = {
            n["metadata"]["name"]
            for n in nodes
            if ALLOCATOR_ANNOTATION in n["metadata"].get("annotations", {})
        }
        return ready >= set(self.nodes) and "serving nodes" in self.agent_log().read_text(errors="replace")

    def claims_dir(self, node: str) -> Path:
        """What the node's notebooks hold through the fake GPU framework: its plugin measures it
        (the agent's folder, :meth:`NodeAgent.claims_dir`)."""
        return self.state_dir / "nodes" / node / "usage-claims"

    def agent_log(self) -> Path:
        assert self.agent is not None
        return self.agent.log

    def kill_agent(self) -> None:
        """SIGKILL the agent, as a crash would; its notebooks keep running."""
        if self.agent is not None:
            self.agent.kill()

    def notebook_logs(self) -> list[Path]:
        return sorted(self.cluster.logs.glob("pod-*.log"))

    def _cleanup(self) -> None:
        stop_recorded(self.state_dir)
