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

from .clusterbase import SA_PATH
from .controlplane import CONTROLLERS, DRA_GATES, REAL_NODE_CONTROLLERS, ControlPlane
from .kwoknodes import KWOK_NODE_ANNOTATION, KwokNodes
from .schedulers import Schedulers

__all__ = [
    "CONTROLLERS",
    "DRA_GATES",
    "KWOK_NODE_ANNOTATION",
    "REAL_NODE_CONTROLLERS",
    "SA_PATH",
    "LocalCluster",
]


class LocalCluster(Schedulers, KwokNodes, ControlPlane):
    """One local control plane. Not thread-safe; one per test session is plenty.

    Its rooms: :mod:`.clusterbase` (folders, components, the admin's API access),
    :mod:`.controlplane` (etcd, the API server, the controllers, kwok, the real nodes' network),
    :mod:`.kwoknodes` (simulated GPU nodes) and :mod:`.schedulers` (kube-schedulers, extenders).
    """
