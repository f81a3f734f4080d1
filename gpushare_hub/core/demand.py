"""What a pod asks for, read from a Pod object.

Rules, matching Kubernetes' own accounting of extended resources:

* a container's amount is its **limit** of the resource (the request if only that is set);
* the pod's amount is ``max(sum of app containers + restartable sidecars,
  each init container + the sidecars started before it)``;
* ``aliyun.com/gpu-mem: m`` alone: ``m`` units on one card;
* ``aliyun.com/gpu-count: n`` alone: ``n`` whole (empty) cards on one node;
* both: ``n`` distinct cards with ``m / n`` units each (``m`` must divide by ``n``).

Optional pod annotations: ``gpushare-hub.io/card-models`` (comma list the card
model must match), ``gpushare-hub.io/exclude-card-models``, and
``gpushare-hub.io/policy`` (``binpack`` / ``spread`` / ...), and ``gpushare-hub.io/isolation``
(the isolation tier the pod requires: ``mps`` or ``driver``; see isolation.py). tkestack's
``nvidia.com/use-gputype`` / ``nvidia.com/nouse-gputype`` are read as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .cards import model_matches
from .errors import InvalidObject
from .isolation import check_tier
from .names import (
    EXCLUDE_MODELS_ANNOTATION,
    ISOLATION_ANNOTATION,
    MODELS_ANNOTATION,
    POLICY_ANNOTATION,
    TKESTACK_NOUSE,
    TKESTACK_USE,
)
from .objects import Container, PodObject
from .resources import DEFAULT_NAMES, ResourceNames, parse_units


@dataclass(frozen=True)
class Demand:
    """A pod's GPU demand. ``per_card is None`` means whole cards."""

    key: str
    per_card: int | None
    count: int
    containers: tuple[tuple[str, int], ...] = ()
    # Containers asking whole cards by the count resource: their Allocate is a gpu-count one.
    count_containers: tuple[tuple[str, int], ...] = ()
    models: tuple[str, ...] = ()
    exclude_models: tuple[str, ...] = ()
    policy: str | None = None
    isolation: str | None = None  # the tier the pod requires (None: any node)
    uid: str = ""
    cpu_milli: int = 0
    memory_mib: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.count < 0 or (self.per_card is not None and self.per_card <= 0):
            raise InvalidObject(f"pod {self.key}: a demand needs count >= 0 and a positive amount per card")

    @property
    def wants_gpu(self) -> bool:
        return self.count > 0

    @property
    def whole(self) -> bool:
        return self.per_card is None

    def model_allowed(self, model: str) -> bool:
        if self.models and not any(model_matches(model, m) for m in self.models):
            return False
        return not any(model_matches(model, m) for m in self.exclude_models)

    def describe(self, names: ResourceNames = DEFAULT_NAMES) -> str:
        """``"5 GiB on one card"`` / ``"2 whole cards"`` / ``"2 cards with 4 GiB each"``."""
        if self.per_card is None:
            return f"{self.count} whole card{'s' if self.count != 1 else ''}"
        if self.count == 1:
            return f"{names.fmt(self.per_card)} on one card"
        return f"{self.count} cards with {names.fmt(self.per_card)} each"

    def model_phrase(self) -> str:
        """``"Tesla-T4 "`` when the pod restricts models, else ``""``: for messages."""
        return ("/".join(self.models) + " ") if self.models else ""

    def tier_phrase(self) -> str:
        """``" on a node with mps isolation"`` when the pod requires a hard tier, else ``""``."""
        if self.isolation is None or self.isolation == "cooperative":
            return ""
        return f" on a node with {self.isolation} isolation"


def container_amount(container: Container, resource: str, where: str) -> int:
    """One container's amount of ``resource``: its limit (or request if only that is set)."""
    limits, requests = container.limits, container.requests
    if resource in limits:
        value = limits[resource]
        if resource in requests and parse_units(requests[resource], what=where) != parse_units(
            value, what=where
        ):
            raise InvalidObject(
                f"{where}: requests and limits of {resource} differ; extended resources need them equal"
            )
    elif resource in requests:
        value = requests[resource]
    else:
        return 0
    return parse_units(value, what=where)


def _pod_amount(pod: PodObject, resource: str) -> tuple[int, list[tuple[str, int]]]:
    """The pod's effective amount under the init-container rule, and each container's amount."""
    per: list[tuple[str, int]] = []
    sidecars_so_far = 0
    init_peak = 0
    for c in pod.init_containers:
        amt = container_amount(c, resource, f"pod {pod.key} init container {c.name} {resource}")
        if amt:
            per.append((c.name, amt))
        if c.restart_policy == "Always":
            sidecars_so_far += amt
            init_peak = max(init_peak, sidecars_so_far)
        else:
            init_peak = max(init_peak, sidecars_so_far + amt)
    app = 0
    for c in pod.containers:
        amt = container_amount(c, resource, f"pod {pod.key} container {c.name} {resource}")
        if amt:
            per.append((c.name, amt))
        app += amt
    return max(init_peak, app + sidecars_so_far), per


# A pod's card-model lists are written by its owner and read for every card the placer weighs:
# bounded, so that no pod makes a filter call slow for everyone (a real list names a few models).
MAX_MODELS = 16
MAX_MODEL_CHARS = 64


def _models(ann: Mapping[str, str], names: tuple[str, str], key: str) -> tuple[str, ...]:
    """The comma-separated card models of the first of ``names`` set on the pod, checked."""
    annotation = next((n for n in names if ann.get(n)), names[0])
    raw = ann.get(annotation) or ""
    if len(raw) > MAX_MODELS * (MAX_MODEL_CHARS + 1):
        raise InvalidObject(
            f"pod {key}: annotation {annotation} is {len(raw)} characters long; list at most "
            f"{MAX_MODELS} card models of at most {MAX_MODEL_CHARS} characters each, e.g. Tesla-T4,Tesla-V100"
        )
    models = tuple(dict.fromkeys(v.strip() for v in raw.split(",") if v.strip()))
    long = [m for m in models if len(m) > MAX_MODEL_CHARS]
    if len(models) > MAX_MODELS or long:
        what = f"a model of {len(long[0])} characters" if long else f"{len(models)} card models"
        raise InvalidObject(
            f"pod {key}: annotation {annotation} lists {what}; list at most {MAX_MODELS} card "
            f"models of at most {MAX_MODEL_CHARS} characters each, e.g. Tesla-T4,Tesla-V100"
        )
    return models


def _isolation(ann: Mapping[str, str], key: str) -> str | None:
    raw = ann.get(ISOLATION_ANNOTATION)
    if raw is None or raw == "":
        return None
    return check_tier(raw, f"pod {key}: annotation {ISOLATION_ANNOTATION}")


def _lenient_isolation(ann: Mapping[str, str], key: str) -> str | None:
    try:
        return _isolation(ann, key)
    except InvalidObject:
        return None


def demand_from_pod(
    pod: PodObject, names: ResourceNames = DEFAULT_NAMES, *, placing: bool = True
) -> Demand | None:
    """The pod's GPU demand, or ``None`` if it asks for neither resource.

    ``placing=False`` (reading the record of a pod already placed): the tier the pod requires
    matters only to placement, so a value that names no tier, which the pod's owner may write at
    any time, is read as none instead of making the record unreadable (and its card free).
    """
    key = pod.key
    mem, per_container = _pod_amount(pod, names.memory)
    count, count_containers = _pod_amount(pod, names.count)
    if mem == 0 and count == 0:
        return None
    ann = pod.annotations
    if count == 0:
        count, per_card = 1, mem
    elif mem == 0:
        per_card = None
    elif mem % count:
        raise InvalidObject(
            f"pod {key}: {names.memory}={mem} does not divide evenly over {names.count}={count} cards; "
            f"ask for a multiple of {count}"
        )
    else:
        per_card = mem // count
    return Demand(
        key=key,
        uid=pod.uid,
        per_card=per_card,
        count=count,
        containers=tuple(per_container),
        count_containers=tuple(count_containers),
        models=_models(ann, (MODELS_ANNOTATION, TKESTACK_USE), key),
        exclude_models=_models(ann, (EXCLUDE_MODELS_ANNOTATION, TKESTACK_NOUSE), key),
        policy=ann.get(POLICY_ANNOTATION) or None,
        isolation=_isolation(ann, key) if placing else _lenient_isolation(ann, key),
        labels=pod.labels,
    )
