"""``gpushare-bench service-memory``: what the hub service holds for a cluster of a given size.

A synthetic cluster, in the JSON shape the API server returns (metadata with labels,
annotations, owner references and managed fields; specs with containers, volumes and
tolerations; statuses with conditions and container states): ``--nodes`` GPU nodes (two Tesla
T4 each, with the device plugin's card inventory), and ``--pods`` pods of which ``--holders``
are hub notebooks holding a 5 GiB slice (a valid allocation record, hub user and server) and
the rest are ordinary workloads without a GPU, a twentieth of them finished jobs.

Each object is decoded from its own JSON text as a list or watch event would be, fed to the
informer (nodes first, then pods) and dropped, so what stays is what the code keeps. Three
holders are measured one after another in the same process with :mod:`tracemalloc`:

* *informer, every pod*: a :class:`~gpushare_hub.kube.informer.LedgerInformer` without
  subscribers or pod filter (as the extender keeps it);
* *raw copies*: the informer plus a copy of every Node and Pod object, the report rebuilt from
  those copies with :func:`~gpushare_hub.core.report.build_report` (a second ledger): how the
  service held its state until 2026-11;
* *service*: the service's own :class:`~gpushare_hub.service.sources.Cluster`, as it runs.

For each: *held* (traced memory still allocated after the feed, after a garbage collection),
*feed peak* (the most traced at any moment of the feed), *with report* (held once the
dashboard's report has been built and cached) and *report peak* (the most traced while it was
built), in MiB; and the report's build time. Apart from those, *one list decoded*: what a
list of every pod weighs while a relist applies it (the informer's list call reads one
answer, not pages). Figures, never pass/fail.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

from .args import at_least_one

HUB_NAMESPACE = "jhub"
NAMESPACES = ("default", "monitoring", "ingress", "batch", "web", "data", "ci", "logging")
MIB = 1024 * 1024


def _managed_fields(manager: str, when: str) -> list[dict[str, Any]]:
    return [
        {
            "manager": manager,
            "operation": "Update",
            "apiVersion": "v1",
            "time": when,
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}}},
                "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:image": {}, "f:name": {}}}},
            },
        },
        {
            "manager": "kubelet",
            "operation": "Update",
            "apiVersion": "v1",
            "time": when,
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:phase": {}}},
            "subresource": "status",
        },
    ]


def node_object(i: int) -> dict[str, Any]:
    """A GPU node with two Tesla T4, as ``GET /api/v1/nodes`` lists it."""
    from gpushare_hub.core.cards import cards_to_annotation, declared_cards
    from gpushare_hub.core.names import CARDS_ANNOTATION

    name = f"gpu-{i:04d}"
    when = "2026-11-01T08:00:00Z"
    cards = declared_cards(name, 2, "Tesla T4", 15360)
    condition = {"lastHeartbeatTime": when, "lastTransitionTime": when}
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"00000000-0000-4000-8000-{i:012d}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": when,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "g4dn.12xlarge",
                "topology.kubernetes.io/region": "eu-west-1",
                "topology.kubernetes.io/zone": f"eu-west-1{'abc'[i % 3]}",
                "gpushare": "true",
                "gpushare-hub.io/card-model": "Tesla-T4",
            },
            "annotations": {
                CARDS_ANNOTATION: cards_to_annotation(cards),
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
            "managedFields": _managed_fields("kubelet", when),
        },
        "spec": {"podCIDR": f"10.{i // 250}.{i % 250}.0/24", "providerID": f"aws:///eu-west-1a/i-{i:017x}"},
        "status": {
            "capacity": {
                "cpu": "48",
                "memory": "195784676Ki",
                "pods": "110",
                "ephemeral-storage": "104845292Ki",
                "aliyun.com/gpu-mem": "30",
                "aliyun.com/gpu-count": "2",
            },
            "allocatable": {
                "cpu": "47600m",
                "memory": "189394404Ki",
                "pods": "110",
                "ephemeral-storage": "96625420948",
                "aliyun.com/gpu-mem": "30",
                "aliyun.com/gpu-count": "2",
            },
            "conditions": [
                {**condition, "type": t, "status": "False", "reason": f"Kubelet{r}", "message": m}
                for t, r, m in (
                    ("MemoryPressure", "HasSufficientMemory", "kubelet has sufficient memory available"),
                    ("DiskPressure", "HasNoDiskPressure", "kubelet has no disk pressure"),
                    ("PIDPressure", "HasSufficientPID", "kubelet has sufficient PID available"),
                )
            ]
            + [{**condition, "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "ok"}],
            "addresses": [
                {"type": "InternalIP", "address": f"10.128.{i // 250}.{i % 250}"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"{i:032x}",
                "systemUUID": f"ec2{i:029x}",
                "bootID": f"{i:08x}-0000-4000-8000-000000000000",
                "kernelVersion": "6.8.0-1019-aws",
                "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.33.2",
                "kubeProxyVersion": "v1.33.2",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [
                {"names": [f"registry.example.org/team/image-{k}@sha256:{k:064x}"], "sizeBytes": 10**8 + k}
                for k in range(12)
            ],
        },
    }


def pod_object(i: int, nodes: int, holder: bool, finished: bool) -> dict[str, Any]:
    """A notebook holding a 5 GiB slice (``holder``) or an ordinary workload's pod."""
    from gpushare_hub.core.annotations import AllocationRecord, CardShare, ContainerShare
    from gpushare_hub.core.cards import declared_cards
    from gpushare_hub.core.names import ALLOCATION_ANNOTATION

    node = f"gpu-{i % nodes:04d}"
    when = "2026-11-20T09:30:00Z"
    namespace = HUB_NAMESPACE if holder else NAMESPACES[i % len(NAMESPACES)]
    name = f"jupyter-user{i}" if holder else f"app{i % 97}-7d9f8c6b5-{i:05x}"
    annotations: dict[str, str] = {"kubectl.kubernetes.io/restartedAt": when}
    limits = {"cpu": "2", "memory": "4Gi"}
    if holder:
        uuid = declared_cards(node, 2, "Tesla T4", 15360)[0].uuid
        record = AllocationRecord(
            node=node, cards=(CardShare(uuid, 0, 5),), containers=(ContainerShare("notebook", uuid, 5),)
        )
        annotations.update(
            {
                ALLOCATION_ANNOTATION: record.to_json(),
                "hub.jupyter.org/username": f"user{i}",
                "hub.jupyter.org/servername": "",
                "gpushare-hub.io/slice": "t4-5g",
            }
        )
        limits["aliyun.com/gpu-mem"] = "5"
    container = "notebook" if holder else "main"
    phase = "Succeeded" if finished else "Running"
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "generateName": name.rsplit("-", 1)[0] + "-",
            "namespace": namespace,
            "uid": f"11111111-0000-4000-8000-{i:012d}",
            "resourceVersion": str(500_000 + i),
            "creationTimestamp": when,
            "labels": {"app": f"app{i % 97}", "pod-template-hash": "7d9f8c6b5", "component": container},
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"app{i % 97}-7d9f8c6b5",
                    "uid": f"22222222-0000-4000-8000-{i % 97:012d}",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": _managed_fields("kube-controller-manager", when),
        },
        "spec": {
            "volumes": [
                {
                    "name": "kube-api-access",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt"}]}},
                        ],
                        "defaultMode": 420,
                    },
                }
            ],
            "containers": [
                {
                    "name": container,
                    "image": f"registry.example.org/team/{container}:1.{i % 7}",
                    "args": ["--port=8080", "--log-level=info"],
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "resources": {"limits": limits, "requests": dict(limits)},
                    "volumeMounts": [
                        {
                            "name": "kube-api-access",
                            "readOnly": True,
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Never" if finished else "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "nodeName": node,
            "schedulerName": "gpushare-scheduler" if holder else "default-scheduler",
            "tolerations": [
                {"key": k, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
                for k in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": phase,
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": when}
                for t in (
                    "PodReadyToStartContainers",
                    "Initialized",
                    "Ready",
                    "ContainersReady",
                    "PodScheduled",
                )
            ],
            "hostIP": f"10.128.{(i % nodes) // 250}.{i % 250}",
            "podIP": f"10.{i // 60000}.{(i // 250) % 240}.{i % 250}",
            "startTime": when,
            "containerStatuses": [
                {
                    "name": container,
                    "state": {"running": {"startedAt": when}},
                    "ready": True,
                    "restartCount": 0,
                    "image": f"registry.example.org/team/{container}:1.{i % 7}",
                    "imageID": f"registry.example.org/team/{container}@sha256:{i:064x}",
                    "containerID": f"containerd://{i:064x}",
                    "started": True,
                }
            ],
            "qosClass": "Guaranteed",
        },
    }


def cluster_texts(nodes: int, pods: int, holders: int) -> tuple[list[str], list[str]]:
    """The objects as JSON texts (decoded again for each event: nothing is shared)."""
    node_texts = [json.dumps(node_object(i)) for i in range(nodes)]
    pod_texts = [
        json.dumps(pod_object(i, nodes, holder=i < holders, finished=i >= holders and i % 20 == 0))
        for i in range(pods)
    ]
    return node_texts, pod_texts


# ---- the three holders -------------------------------------------------------------------------


class Holder:
    """Something fed Node and Pod events that can build the dashboard's report."""

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def report(self) -> Any:
        return None


class InformerAlone(Holder):
    def __init__(self, names: Any) -> None:
        from gpushare_hub.kube.informer import LedgerInformer

        self.informer = LedgerInformer(None, names)

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        self.informer.apply(kind, "ADDED", obj)


class RawCopies(InformerAlone):
    """The informer plus every object as decoded, and a report rebuilt from those copies."""

    def __init__(self, names: Any) -> None:
        super().__init__(names)
        self.names = names
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"nodes": {}, "pods": {}}

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        from gpushare_hub.core.objects import pod_key

        super().apply(kind, obj)
        key = str(obj["metadata"]["name"]) if kind == "nodes" else pod_key(obj)
        self.objects[kind][key] = obj

    def report(self) -> Any:
        from gpushare_hub.core.report import build_report
        from gpushare_hub.core.shapes import read_node, read_pod

        return build_report(
            [read_node(n) for n in self.objects["nodes"].values()],
            [read_pod(p) for p in self.objects["pods"].values()],
            self.names,
            hub_namespaces={HUB_NAMESPACE},
        )


class Service(Holder):
    """The hub service's ``Cluster``, subscribed to its informer as the service does."""

    def __init__(self, names: Any) -> None:
        try:  # the service's data sources (in service.app before the service was split into rooms)
            from gpushare_hub.service import sources
        except ImportError:  # measuring an older commit runs this file there
            from gpushare_hub.service import app as sources  # type: ignore[no-redef]

        self.cluster = sources.Cluster(
            _service_informer(sources, names), names, 30.0, hub_namespaces={HUB_NAMESPACE}
        )
        self.informer: Any = self.cluster._subscribed()  # what SharedLedger starts; no API server here

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        self.informer.apply(kind, "ADDED", obj)

    def report(self) -> Any:
        return self.cluster.report()


def _service_informer(app: Any, names: Any) -> Callable[[], Any]:
    """The informer the service makes (before 2026-11-25 a plain LedgerInformer, which the
    service module did not name: measuring an older commit runs this file there)."""
    make = getattr(app, "service_informer", None)
    if make is not None:
        return lambda: make(None, names)
    from gpushare_hub.kube.informer import LedgerInformer

    return lambda: LedgerInformer(None, names)


HOLDERS: dict[str, Callable[[Any], Holder]] = {
    "informer, every pod": InformerAlone,
    "raw copies (the old way)": RawCopies,
    "service": Service,
}


def _events(node_texts: list[str], pod_texts: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    for text in node_texts:
        yield "nodes", json.loads(text)
    for text in pod_texts:
        yield "pods", json.loads(text)


def measure(make: Callable[[Any], Holder], node_texts: list[str], pod_texts: list[str]) -> dict[str, Any]:
    """Feed every object to a new holder under tracemalloc; sizes in MiB."""
    from gpushare_hub.core import DEFAULT_NAMES

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    holder = make(DEFAULT_NAMES)
    for kind, obj in _events(node_texts, pod_texts):
        holder.apply(kind, obj)
        del obj
    gc.collect()
    held, feed_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    t0 = time.perf_counter()
    report = holder.report()
    report_ms = (time.perf_counter() - t0) * 1000
    gc.collect()
    with_report, report_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    shown = 0 if report is None else sum(len(c.pods) for n in report.nodes for c in n.cards)
    del holder, report
    return {
        "held_mib": round((held - base) / MIB, 2),
        "feed_peak_mib": round((feed_peak - base) / MIB, 2),
        "with_report_mib": round((with_report - base) / MIB, 2),
        "report_peak_mib": round((max(report_peak, with_report) - base) / MIB, 2),
        "report_ms": round(report_ms, 1),
        "slices_in_report": shown,
    }


def bench_service_memory(nodes: int, pods: int, holders: int) -> dict[str, Any]:
    node_texts, pod_texts = cluster_texts(nodes, pods, holders)
    for make in HOLDERS.values():  # imports and first-use caches first: they are not what is held
        measure(make, node_texts[:2], [*pod_texts[:2], *pod_texts[holders : holders + 2]])
    return {
        "nodes": nodes,
        "pods": pods,
        "holders": holders,
        "json_mib": round(sum(len(t) for t in (*node_texts, *pod_texts)) / MIB, 1),
        "holders_measured": {name: measure(make, node_texts, pod_texts) for name, make in HOLDERS.items()},
        "pod_list_decoded_mib": list_decoded(pod_texts),
    }


def list_decoded(pod_texts: list[str]) -> float:
    """MiB of every pod decoded from one list answer, as a relist holds them."""
    body = '{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[%s]}'
    text = body % ",".join(pod_texts)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    items = json.loads(text)["items"]
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    del items
    return round(held / MIB, 2)


def add_parser(sub: Any) -> None:
    sp = sub.add_parser("service-memory", help="memory the hub service holds for a large cluster")
    sp.add_argument("--nodes", type=at_least_one, default=1000, help="GPU nodes (two Tesla T4 each)")
    sp.add_argument("--pods", type=at_least_one, default=10_000, help="pods in the cluster")
    sp.add_argument("--holders", type=at_least_one, default=500, help="of those, notebooks holding a slice")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.holders > args.pods or args.holders > 3 * args.nodes:
        raise SystemExit(
            f"gpushare-bench service-memory: --holders {args.holders} must be at most --pods and at most "
            "three per node (5 GiB slices on the first card of each node); give fewer holders"
        )
    out = bench_service_memory(args.nodes, args.pods, args.holders)
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"{out['nodes']} nodes, {out['pods']} pods ({out['holders']} holding slices), "
        f"{out['json_mib']} MiB as JSON; tracemalloc, MiB"
    )
    print(
        f"  {'':26s} {'held':>8s} {'feed peak':>10s} {'with report':>12s} {'report peak':>12s} {'report':>9s}"
    )
    for name, r in out["holders_measured"].items():
        print(
            f"  {name:26s} {r['held_mib']:8.2f} {r['feed_peak_mib']:10.2f} {r['with_report_mib']:12.2f} "
            f"{r['report_peak_mib']:12.2f} {r['report_ms']:7.1f}ms"
        )
    decoded = out["pod_list_decoded_mib"]
    print(f"  one list of every pod, decoded (held while a relist applies it): {decoded:.2f}")
    return 0
