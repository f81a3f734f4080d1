"""``kubectl-inspect-gpushare``: kubectl finds it on PATH as the plugin ``kubectl inspect gpushare``.

It reads Nodes, Pods and ResourceClaims (where the cluster serves them) once with
:mod:`gpushare_hub.kube.rest` (the standard library's HTTP
client: no Kubernetes client library is imported, so the command answers as fast as kubectl's
other plugins) and prints the core's report.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from gpushare_hub.core.claims import read_claim
from gpushare_hub.core.errors import InvalidObject
from gpushare_hub.core.resources import DEFAULT_NAMES, ResourceNames
from gpushare_hub.core.shapes import read_node, read_pod
from gpushare_hub.kube.kubeconfig import (
    Access,
    KubeconfigError,
    default_kubeconfig_paths,
    in_cluster_access,
    kubeconfig_problem,
    read_kubeconfig,
)

from .claims import list_claims, report_with_claims
from .render import details, summary

PROG = "kubectl-inspect-gpushare"
T = TypeVar("T")


def _access(kubeconfig: str | None, context: str | None) -> Access:
    """The kubeconfig named, else $KUBECONFIG or ~/.kube/config, else the pod's service account."""
    if kubeconfig:
        if problem := kubeconfig_problem(kubeconfig, context):
            raise SystemExit(f"{PROG}: {problem}")
        try:
            return read_kubeconfig(kubeconfig, context)
        except KubeconfigError as err:  # the file the user named is not usable: never fall back silently
            raise SystemExit(f"{PROG}: --kubeconfig {kubeconfig}: {err}") from None
    try:
        return read_kubeconfig(default_kubeconfig_paths(), context)
    except KubeconfigError as kube_err:
        if context:  # a context was asked for: it can only come from a kubeconfig
            raise SystemExit(f"{PROG}: {kube_err}") from None
        try:
            return in_cluster_access()
        except KubeconfigError:
            raise SystemExit(
                f"{PROG}: no cluster to talk to ({kube_err}); set KUBECONFIG or pass --kubeconfig"
            ) from None


def _load(
    kubeconfig: str | None, node: str | None, context: str | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    from gpushare_hub.kube.execcred import CredentialError
    from gpushare_hub.kube.rest import ApiStatusError, RestClient, Unreachable

    access = _access(kubeconfig, context)
    server = access.server
    try:
        with RestClient(access) as api:
            nodes = api.list("/api/v1/nodes")
            query = {"fieldSelector": f"spec.nodeName={node}"} if node else None
            claims, problem = list_claims(api)
            pods = api.list("/api/v1/pods", query)
    except ApiStatusError as err:
        if err.status in (401, 403):
            raise SystemExit(
                f"{PROG}: the API server at {server} refused ({err.status} {err.reason}); "
                "this needs list on nodes and on pods in all namespaces (kubectl auth can-i list pods -A)"
            ) from None
        raise SystemExit(f"{PROG}: the API server at {server} answered {err.status} {err.reason}") from None
    except Unreachable as err:
        raise SystemExit(
            f"{PROG}: cannot reach the API server at {server} ({err.reason}); "
            "check that the cluster runs and which context your kubeconfig uses (kubectl cluster-info)"
        ) from None
    except (KubeconfigError, CredentialError) as err:
        where = f"--kubeconfig {kubeconfig}: " if kubeconfig else ""
        raise SystemExit(f"{PROG}: {where}{err}") from None
    if node and not any((n.get("metadata") or {}).get("name") == node for n in nodes):
        raise SystemExit(f"{PROG}: node {node!r} not found")
    if problem:
        print(f"{PROG}: warning: {problem}", file=sys.stderr)
    return nodes, pods, claims


def _read(objs: list[dict[str, Any]], reader: Callable[[object], T]) -> list[T]:
    """The objects read into the core's form; one that cannot be read is left out, with a warning."""
    out = []
    for obj in objs:
        try:
            out.append(reader(obj))
        except InvalidObject as err:
            print(f"{PROG}: warning: left out: {err}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="kubectl-inspect-gpushare",
        description="Show which pods hold how much GPU memory on each shared card "
        "(the tables of Aliyun's kubectl-inspect-gpushare, from gpushare-hub's ledger).",
    )
    p.add_argument("node", nargs="?", help="show only this node")
    p.add_argument("-d", "--details", action="store_true", help="one table per node, with its pods")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", help="the kubeconfig context to use (default: its current-context)")
    p.add_argument("--resource", default=DEFAULT_NAMES.memory, help="GPU memory resource name")
    p.add_argument("--count-resource", default=DEFAULT_NAMES.count, help="GPU count resource name")
    p.add_argument("--unit", default=DEFAULT_NAMES.unit, help="unit of the memory resource (GiB or MiB)")
    args = p.parse_args(argv)
    try:
        names = ResourceNames(memory=args.resource, count=args.count_resource, unit=args.unit)
    except ValueError as err:
        p.error(str(err))
    nodes, pods, claims = _load(args.kubeconfig, args.node, args.context)
    report = report_with_claims(
        _read(nodes, read_node), _read(pods, read_pod), _read(claims, read_claim), names, only_node=args.node
    )
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(details(report) if args.details else summary(report))
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
