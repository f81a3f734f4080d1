"""The two tables of Aliyun's ``kubectl-inspect-gpushare``, with the same columns and layout.

``summary``: one line per node (``GPU<i>(Allocated/Total)`` per card, ``PENDING(Allocated)``
when some node has GPU pods bound without a card, ``GPU Memory`` used/total), a dashed
rule, and the cluster total. ``details`` (``-d``): per node its pods with the units they
hold on each card. What we add comes *after* Aliyun's columns or below its tables, so a
script that reads theirs reads ours: a ``HUB USER`` column when pods carry KubeSpawner's
annotations, GPU pods that wait for a node with the scheduler's reason, and nodes whose
card inventory cannot be read. Where some node's device plugin measures usage, ``-d`` adds
``GPU MEM USED``, ``GPU UTIL`` and ``GPU IDLE`` after those: what each pod's processes hold
and do on its card ("over" past its slice), and for how long it has done nothing there.
"""

from __future__ import annotations

import time

from gpushare_hub.core.durations import compact
from gpushare_hub.core.reportrows import NodeRow, PodRow, Report

from .tabwriter import tabulate


def _pct(used: int, total: int) -> int:
    return int(used / total * 100) if total > 0 else 0


def _cluster_total(report: Report) -> str:
    return f"{report.used}/{report.total} ({_pct(report.used, report.total)}%)\t\n"


def _extras(report: Report) -> str:
    out = ""
    broken = [n for n in report.nodes if n.problem]
    if broken:
        out += "\nNodes whose GPU inventory cannot be read (not counted above):\n"
        out += "".join(f"{n.name}\t{n.problem}\n" for n in broken)
    if report.pending:
        out += f"\nPending GPU pods (not placed on any node):\nNAME\tNAMESPACE\t{report.unit}\tREASON\n"
        out += "".join(f"{p.name}\t{p.namespace}\t{p.units}\t{p.reason}\n" for p in report.pending)
    return out


def summary(report: Report) -> str:
    nodes = [n for n in report.nodes if n.total > 0]
    max_cards = max((len(n.cards) for n in nodes), default=0)
    has_pending = any(n.unplaced for n in nodes)
    text = "NAME\tIPADDRESS\t" + "".join(f"GPU{i}(Allocated/Total)\t" for i in range(max_cards))
    if has_pending:
        text += "PENDING(Allocated)\t"
    text += "GPU Memory\n"
    rule = 0
    for n in nodes:
        row = f"{n.name}\t{n.address}\t"
        for i in range(max_cards):
            row += f"{n.cards[i].used}/{n.cards[i].units}\t" if i < len(n.cards) else "0/0\t"
        if has_pending:
            row += f"{sum(p.units for p in n.unplaced)}\t" if n.unplaced else "\t"
        row += f"{n.used}/{n.total}\n"
        text += row
        rule = rule or len(row.encode()) + 20
    text += "-" * rule + "\n"
    text += "Allocated/Total GPU Memory In Cluster:\n" + _cluster_total(report)
    return tabulate(text + _extras(report))


def _usage_cells(p: PodRow, measured: bool, now: float) -> str:
    if not measured or p.used_mib is None:
        return "n/a\tn/a\tn/a\t"
    used = f"{p.used_mib / 1024:.1f} GiB" + (" over" if p.over_slice else "")
    if p.sm_util is None:
        return f"{used}\tn/a\tn/a\t"
    idle = "-" if p.idle_since is None else compact(max(0, int(now) - p.idle_since))
    return f"{used}\t{p.sm_util}%\t{idle}\t"


def _pod_line(
    p: PodRow, column: int, columns: int, with_user: bool, usage: tuple[bool, float] | None = None
) -> str:
    line = f"{p.name}\t{p.namespace}\t" + "".join(
        f"{p.units if k == column else 0}\t" for k in range(columns)
    )
    if with_user:
        line += f"{p.hub_user}{'/' + p.hub_server if p.hub_server else ''}\t"
    if usage is not None:
        line += _usage_cells(p, *usage)
    return line + "\n"


def _node_details(n: NodeRow, with_user: bool, with_usage: bool = False, now: float = 0.0) -> tuple[str, str]:
    """(the node's table, its pod lines alone: Aliyun sizes the dashed rule on those)."""
    columns = len(n.cards) + (1 if n.unplaced else 0)
    head = f"\nNAME:\t{n.name}\nIPADDRESS:\t{n.address}\n\n"
    head += "NAME\tNAMESPACE\t" + "".join(f"GPU{i}(Allocated)\t" for i in range(len(n.cards)))
    if n.unplaced:
        head += "Pending(Allocated)\t"
    if with_user:
        head += "HUB USER\t"
    usage = (n.usage_measured, now) if with_usage else None
    if with_usage:
        head += "GPU MEM USED\tGPU UTIL\tGPU IDLE\t"
    head += "\n"
    pods = "".join(_pod_line(p, i, columns, with_user, usage) for i, c in enumerate(n.cards) for p in c.pods)
    # Pods without a card hold nothing on any card: nothing to measure.
    pods += "".join(
        _pod_line(p, len(n.cards), columns, with_user, (False, now) if usage else None) for p in n.unplaced
    )
    tail = f"Allocated :\t{n.used} ({_pct(n.used, n.total)}%)\t\nTotal :\t{n.total} \t\n"
    return head + pods + tail, pods


def details(report: Report, now: float | None = None) -> str:
    with_user = any(p.hub_user for n in report.nodes for c in n.cards for p in c.pods) or any(
        p.hub_user for n in report.nodes for p in n.unplaced
    )
    with_usage = any(n.usage_measured for n in report.nodes)
    when = time.time() if now is None else now
    text = ""
    rule = 0
    for n in report.nodes:
        if n.total <= 0:
            continue
        table, pods = _node_details(n, with_user, with_usage, when)
        rule = rule or len(pods.encode()) + 10
        text += table + "-" * rule + "\n"
    text += "\n\nAllocated/Total GPU Memory In Cluster:\t" + _cluster_total(report)
    return tabulate(text + _extras(report))
