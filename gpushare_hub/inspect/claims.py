"""ResourceClaims for ``kubectl inspect gpushare``: read once beside Nodes and Pods, counted in
the same ledger (:mod:`gpushare_hub.core.claims`), so a notebook on the DRA path shows on its
card like one placed by our scheduler. A cluster that serves no ``resource.k8s.io/v1`` shows
annotations alone."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from gpushare_hub.core.claims import ClaimIgnored, ClaimObject
from gpushare_hub.core.errors import GPUShareError
from gpushare_hub.core.ledger import Ledger
from gpushare_hub.core.objects import NodeObject, PodObject
from gpushare_hub.core.report import report_from_ledger
from gpushare_hub.core.reportfacts import NodeFacts, PodFacts, node_facts, pod_facts
from gpushare_hub.core.reportrows import Report
from gpushare_hub.core.resources import DEFAULT_NAMES, ResourceNames

CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"


def list_claims(api: Any) -> tuple[list[dict[str, Any]], str]:
    """Every ResourceClaim, and a warning ("" for none) when they cannot be read: not served
    (404: no DRA on this cluster, said nothing) or forbidden (403)."""
    from gpushare_hub.kube.rest import ApiStatusError

    try:
        return api.list(CLAIMS_PATH), ""
    except ApiStatusError as err:
        if err.status == 404:
            return [], ""
        if err.status == 403:
            return [], (
                "ResourceClaims are not counted: this needs list on resourceclaims.resource.k8s.io "
                "in all namespaces (kubectl auth can-i list resourceclaims.resource.k8s.io -A)"
            )
        raise


def report_with_claims(
    nodes: Iterable[NodeObject],
    pods: Iterable[PodObject],
    claims: Iterable[ClaimObject],
    names: ResourceNames = DEFAULT_NAMES,
    only_node: str | None = None,
) -> Report:
    """:func:`~gpushare_hub.core.report.build_report` with the claims counted too."""
    ledger = Ledger(names)
    shown_nodes: list[NodeFacts] = []
    for node in nodes:
        if only_node and node.name != only_node:
            continue
        shown_nodes.append(node_facts(node, names))
        try:
            ledger.observe_node(node)
        except GPUShareError as err:
            ledger.mark_unreadable(node.name, str(err))
    for claim in claims:
        ledger.observe_claim(claim)
    shown_pods: list[PodFacts] = []
    for pod in pods:
        facts = pod_facts(pod, names)
        if facts is None or (facts.row is not None and only_node and facts.node != only_node):
            continue
        if facts.row is not None:
            try:
                ledger.observe_pod(pod)
            except GPUShareError as err:
                facts = replace(facts, warning=str(err))
        shown_pods.append(facts)
    report = report_from_ledger(ledger, shown_nodes, shown_pods)
    told = [r.message() for r in ledger.ignored() if isinstance(r, ClaimIgnored)]
    return replace(report, warnings=report.warnings + tuple(w for w in told if w not in report.warnings))
