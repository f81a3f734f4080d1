"""The KubeSchedulerConfiguration of a dedicated scheduler that uses the extender.

The default scheduler is never touched (managed clusters forbid it): pods opt in
with ``spec.schedulerName: gpushare-scheduler``. To add the extender to a
scheduler you already run instead, copy the ``extenders`` entry (and, for
binpacking, the NodeResourcesFit scoring of :func:`profile`) into its
configuration; only one extender of a scheduler may have ``bindVerb``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from gpushare_hub.core.names import DRA_PRIORITIZE_VERB, DRA_SCHEDULER_NAME


def extender_entry(
    url_prefix: str,
    resource: str = "aliyun.com/gpu-mem",
    https: bool = False,
    weight: int = 10,
    timeout: str = "5s",
    prioritize: bool = False,
    tls_config: Mapping[str, str] | None = None,
    count_resource: str = "aliyun.com/gpu-count",
) -> dict[str, Any]:
    """One ``extenders`` item: filter and bind (and prioritize if asked), node names only.

    Both resources are managed: kube-scheduler calls an extender with managedResources only
    for pods asking one of them, so a pod asking whole cards by ``count_resource`` alone
    would otherwise be bound by kube-scheduler itself, with no card written on it.

    Without prioritize, kube-scheduler's own NodeResourcesFit scoring on our resource
    (see :func:`profile`) picks the fullest (binpack) or emptiest (spread) node and
    bind picks the card on it. That saves one HTTP call per pod in the scheduler's
    sequential cycle; on the Alibaba trace it changed no peak and cost at most 1% of
    card-hours (docs/measurements/2026-11-21-packing.md). ``fgd`` needs prioritize.

    ``tls_config``: the extender ``tlsConfig`` (``certFile``/``keyFile``: the client
    certificate kube-scheduler presents, which the extender's ``--tls-client-ca``
    signed; ``caFile``: the CA of the extender's serving certificate).

    With prioritize, kube-scheduler adds ``score x weight x 10`` to each node's total. Its own default
    scorers that vary between nodes (PodTopologySpread's system default spreading
    at weight 2, NodeResourcesFit and BalancedAllocation at 1, ImageLocality at 1)
    add up to 500 at most, so weight 10 (up to 1000) lets the placement policy
    decide while still leaving room for affinities a pod asks for explicitly.
    """
    entry: dict[str, Any] = {
        "urlPrefix": url_prefix,
        "filterVerb": "filter",
        "bindVerb": "bind",
        "enableHTTPS": https,
        "httpTimeout": timeout,
        "nodeCacheCapable": True,
        # The in-tree fit check still counts the resource per node; we choose the card.
        "managedResources": [
            {"name": resource, "ignoredByScheduler": False},
            {"name": count_resource, "ignoredByScheduler": False},
        ],
        "ignorable": False,
    }
    if prioritize:
        entry.update(prioritizeVerb="prioritize", weight=weight)
    if tls_config:
        # kube-scheduler's client certificate (mutual TLS) and the CA of the extender's certificate.
        entry["enableHTTPS"] = True
        entry["tlsConfig"] = dict(tls_config)
    return entry


# The DRA entry's weight: kube-scheduler adds score x weight x 10, so one step of the extender's
# 0..10 score (1,000) outweighs all that the default plugins that vary between nodes can add
# (NodeResourcesFit, BalancedAllocation, ImageLocality at 1 and PodTopologySpread's system default
# spreading at 2: 500 at most); the binpack order leads and those plugins break its ties.
DRA_WEIGHT = 100


def dra_extender_entry(
    url_prefix: str,
    https: bool = False,
    timeout: str = "5s",
    tls_config: Mapping[str, str] | None = None,
    weight: int = DRA_WEIGHT,
) -> dict[str, Any]:
    """The ``extenders`` item of the DRA packing (``dra.scheduler: gpushare``): prioritize only.

    No filter, no bind, no managedResources: kube-scheduler's DynamicResources plugin filters the
    nodes, allocates the claim (first fit in our driver's fullest-first device order) and the
    scheduler binds; the extender only ranks nodes as binpack does. Extenders belong to the whole
    configuration, not to a profile, so this one is asked about the pods of every profile: it
    scores DRA pods only and answers an empty list for others. ``ignorable``: with the extender
    down, DRA pods are placed by the default scoring instead of waiting.
    """
    entry: dict[str, Any] = {
        "urlPrefix": url_prefix,
        "prioritizeVerb": DRA_PRIORITIZE_VERB,
        "weight": weight,
        "enableHTTPS": https,
        "httpTimeout": timeout,
        "nodeCacheCapable": True,
        "ignorable": True,
    }
    if tls_config:
        entry["enableHTTPS"] = True
        entry["tlsConfig"] = dict(tls_config)
    return entry


def dra_profile(scheduler_name: str = DRA_SCHEDULER_NAME) -> dict[str, Any]:
    """The DRA pods' profile: kube-scheduler's defaults (DynamicResources on, the default scoring
    breaking the extender's ties, as the dra-ordered-binpack replay models it)."""
    return {"schedulerName": scheduler_name}


def profile(
    scheduler_name: str = "gpushare-scheduler", resource: str = "aliyun.com/gpu-mem", policy: str = "binpack"
) -> dict[str, Any]:
    """The dedicated scheduler's profile, tuned so that its own scoring agrees with the policy.

    kube-scheduler binds asynchronously: the next pod may be filtered and scored
    before the previous bind reaches the extender, and then the extender's scores
    tie. The scheduler itself already counts that assumed pod, so its node scoring
    must pull the same way: MostAllocated on our resource for binpack (and fgd),
    LeastAllocated for spread. The system-default topology spreading, which would
    push notebooks apart, is turned off; constraints a pod states still apply. Outside
    spread, so is the balanced-allocation score: it favours an empty node over one whose
    CPU and memory the hub's own pods already use unevenly, and could outweigh the
    packing (seen on the node tier: a third 5 GiB notebook sent to an empty second node
    beside a card with 5 GiB free).
    """
    strategy = "LeastAllocated" if policy == "spread" else "MostAllocated"
    plugins = (
        {}
        if policy == "spread"
        else {"plugins": {"score": {"disabled": [{"name": "NodeResourcesBalancedAllocation"}]}}}
    )
    return {
        "schedulerName": scheduler_name,
        **plugins,
        "pluginConfig": [
            {
                "name": "NodeResourcesFit",
                "args": {
                    "scoringStrategy": {
                        "type": strategy,
                        "resources": [
                            {"name": resource, "weight": 10},
                            {"name": "cpu", "weight": 1},
                            {"name": "memory", "weight": 1},
                        ],
                    }
                },
            },
            {"name": "PodTopologySpread", "args": {"defaultingType": "List", "defaultConstraints": []}},
        ],
    }


def scheduler_config(
    url_prefix: str,
    scheduler_name: str = "gpushare-scheduler",
    resource: str = "aliyun.com/gpu-mem",
    https: bool = False,
    leader_elect: bool = True,
    policy: str = "binpack",
    tls_config: Mapping[str, str] | None = None,
    dra_scheduler_name: str = "",
) -> dict[str, Any]:
    """``dra_scheduler_name``: add the DRA profile of that name and its prioritize-only entry."""
    cfg: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {
            "leaderElect": leader_elect,
            "resourceName": scheduler_name,
            "resourceNamespace": "kube-system",
        },
        "profiles": [profile(scheduler_name, resource, policy)],
        "extenders": [
            # binpack and spread: kube-scheduler's Most/LeastAllocated chooses the node as they would;
            # scoring policies (fgd, strand) need the extender's prioritize.
            extender_entry(
                url_prefix,
                resource,
                https,
                prioritize=policy not in ("binpack", "spread"),
                tls_config=tls_config,
            )
        ],
    }
    if dra_scheduler_name:
        cfg["profiles"].append(dra_profile(dra_scheduler_name))
        cfg["extenders"].append(dra_extender_entry(url_prefix, https, tls_config=tls_config))
    return cfg


def scheduler_config_yaml(
    url_prefix: str,
    scheduler_name: str = "gpushare-scheduler",
    resource: str = "aliyun.com/gpu-mem",
    https: bool = False,
    policy: str = "binpack",
    tls_config: Mapping[str, str] | None = None,
    dra_scheduler_name: str = "",
) -> str:
    cfg = scheduler_config(
        url_prefix,
        scheduler_name,
        resource,
        https,
        policy=policy,
        tls_config=tls_config,
        dra_scheduler_name=dra_scheduler_name,
    )
    return yaml.safe_dump(cfg, sort_keys=False)
