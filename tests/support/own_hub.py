"""Notebook nodes and a hub of a test's own, beside the session's (its namespace, its scheduler):
for a test whose nodes need settings of their own (a full T4, an overcommitting plugin)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from gpushare_hub.localcluster.hub import LocalHub
from gpushare_hub.localcluster.notebooknodes import LABEL, NotebookNodes
from tests.conftest import wait_for
from tests.support.hub_helpers import pod_of
from tests.support.hub_session import NAMESPACE, SCHEDULER, SLICES, hub_spawner_config


def own_nodes(cluster: Any, label: str, prefix: str, plugin_args: Sequence[str] = ()) -> NotebookNodes:
    """One notebook node (``<prefix>1``, one 15 GiB T4) labelled ``label``, its agent started. The
    agent's name is short (``node-agent-<prefix>``): the plugin's sockets sit under its folder,
    and a Unix socket's path may not pass 107 characters."""
    agent = f"node-agent-{prefix.rstrip('-')}"
    nodes = NotebookNodes(cluster, plugin_args=tuple(plugin_args), name=agent, label_value=label)
    nodes.add(1, cards=1, prefix=prefix)
    nodes.start()
    return nodes


@contextmanager
def own_hub(
    cluster: Any, label: str, name: str, users: Sequence[str], extra_config: str = ""
) -> Iterator[LocalHub]:
    """A GPUShareSpawner hub (the session's catalogue) whose servers go only to nodes labelled
    ``label``; on the way out ``users``' servers are stopped and their pods awaited."""
    spawner = {**hub_spawner_config(), "slices": SLICES, "gpushare_scheduler_name": SCHEDULER}
    spawner["node_selector"] = {LABEL: label}
    h = LocalHub(
        cluster, NAMESPACE, spawner, spawner_class="gpushare_hub.GPUShareSpawner",
        extra_config=extra_config, name=name,
    ).start()  # fmt: skip
    try:
        yield h
    finally:
        for u in users:
            h.api("DELETE", f"/users/{u}/server")
        for u in users:
            wait_for(lambda u=u: pod_of(cluster, u) is None, timeout=120)
        h.stop()
