"""``kubectl-inspect-gpushare``: kubectl finds it on PATH as the plugin ``kubectl inspect gpushare``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpushare_hub.core.report import build_report
from gpushare_hub.core.resources import DEFAULT_NAMES, ResourceNames

from .render import details, summary


def _load(kubeconfig: str | None, node: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from kubernetes import client, config  # imported here: the pure parts need no client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from gpushare_hub.kube.kubeconfig import kubeconfig_problem

    if kubeconfig and (problem := kubeconfig_problem(kubeconfig)):
        raise SystemExit(f"kubectl-inspect-gpushare: {problem}")
    try:
        config.load_kube_config(config_file=kubeconfig)
    except Exception as kube_err:
        if kubeconfig:  # the file the user named is not usable: say so, never fall back silently
            raise SystemExit(f"kubectl-inspect-gpushare: --kubeconfig {kubeconfig}: {kube_err}") from None
        try:
            config.load_incluster_config()
        except Exception:
            raise SystemExit(
                f"kubectl-inspect-gpushare: no cluster to talk to ({kube_err}); "
                "set KUBECONFIG or pass --kubeconfig"
            ) from None
    api = client.ApiClient()
    core = client.CoreV1Api(api)
    server = api.configuration.host
    try:
        nodes: list[dict[str, Any]] = api.sanitize_for_serialization(core.list_node(_request_timeout=30))[
            "items"
        ]
        selector = f"spec.nodeName={node}" if node else None
        pods: list[dict[str, Any]] = api.sanitize_for_serialization(
            core.list_pod_for_all_namespaces(field_selector=selector, _request_timeout=30)
        )["items"]
    except ApiException as err:
        if err.status in (401, 403):
            raise SystemExit(
                f"kubectl-inspect-gpushare: the API server at {server} refused ({err.status} {err.reason}); "
                "this needs list on nodes and on pods in all namespaces (kubectl auth can-i list pods -A)"
            ) from None
        raise SystemExit(
            f"kubectl-inspect-gpushare: the API server at {server} answered {err.status} {err.reason}"
        ) from None
    except HTTPError as err:
        reason = getattr(err, "reason", None) or err
        raise SystemExit(
            f"kubectl-inspect-gpushare: cannot reach the API server at {server} ({reason}); "
            "check that the cluster runs and which context your kubeconfig uses (kubectl cluster-info)"
        ) from None
    if node and not any((n.get("metadata") or {}).get("name") == node for n in nodes):
        raise SystemExit(f"kubectl-inspect-gpushare: node {node!r} not found")
    return nodes, pods


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
    p.add_argument("--resource", default=DEFAULT_NAMES.memory, help="GPU memory resource name")
    p.add_argument("--count-resource", default=DEFAULT_NAMES.count, help="GPU count resource name")
    p.add_argument("--unit", default=DEFAULT_NAMES.unit, help="unit of the memory resource (GiB or MiB)")
    args = p.parse_args(argv)
    try:
        names = ResourceNames(memory=args.resource, count=args.count_resource, unit=args.unit)
    except ValueError as err:
        p.error(str(err))
    nodes, pods = _load(args.kubeconfig, args.node)
    report = build_report(nodes, pods, names, only_node=args.node)
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
