"""What a DRA pod asks, read from its ResourceClaimTemplate, for the prioritize-only verb.

With the chart's ``dra.scheduler: gpushare``, our dedicated scheduler's DRA profile
(:data:`~gpushare_hub.core.names.DRA_SCHEDULER_NAME`) calls the extender's
:data:`~gpushare_hub.core.names.DRA_PRIORITIZE_VERB` for every pod it places. A pod that claims
a slice (:attr:`~gpushare_hub.core.objects.PodObject.claims_dra_slice`) asks no extended
resource: what it asks is in the template its claim is made from, ``spec.spec.devices.requests``.
Only requests of our DeviceClass count; exactly one device (``ExactCount``, count 1) with a
``capacity.requests.memory`` read by the ledger's own strict quantity reading
(:func:`~gpushare_hub.core.claims.memory_bytes`, rounded up to units as the ledger counts the
claim once allocated). A model selector in the chart's form
(``device.attributes["gpushare-hub.io"].model in ["Tesla-T4"]``) restricts the cards scored; any
other selector is left to the scheduler's DynamicResources filter.

A template is written by whoever may write in the namespace: untrusted. A wrong shape is a
:class:`TemplateProblem` naming the template and the field; the pod then gets no score (the
scheduler places it as the default scoring does), never an error answer. Templates are cached
for :data:`TTL` seconds, at most :data:`MAX_TEMPLATES` of them, answers and refusals alike, so
that a pod retried every second reads its template once and a wrong one is logged once a TTL.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare_hub.core import DEFAULT_NAMES, Demand, PodObject, ResourceNames
from gpushare_hub.core.claims import memory_bytes, units_of
from gpushare_hub.core.names import DRA_ATTR_MODEL, DRA_CAPACITY, DRA_DEVICE_CLASS, DRA_DRIVER
from gpushare_hub.core.shapes import described

log = logging.getLogger("gpushare.extender")

TTL = 30.0  # seconds a template's reading is kept
MAX_TEMPLATES = 512  # templates cached (a hub has one per catalogue slice)
MAX_REQUESTS = 32  # resource.k8s.io/v1 DeviceClaim.requests
MAX_SELECTORS = 32  # resource.k8s.io/v1 DeviceRequest selectors
MAX_POD_TEMPLATES = 4  # templates read for one pod; a notebook's pod names one
MAX_MODELS = 16
_MODEL = r'"[A-Za-z0-9._-]{1,64}"'
_MODEL_LIST = re.compile(
    rf'^device\.attributes\["{re.escape(DRA_DRIVER)}"\]\.{DRA_ATTR_MODEL} in \[({_MODEL}(?:, {_MODEL})*)\]$'
)

Fetch = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]  # (namespace, name) -> JSON or None


class TemplateProblem(ValueError):
    """A template whose shape gives no slice to score; the message names it and the field."""


@dataclass(frozen=True)
class TemplateAsk:
    """One share of one card of our DeviceClass: its units, and the models it may run on."""

    units: int
    models: tuple[str, ...] = ()


def _map(value: object, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TemplateProblem(f"{path}: expected an object, got {described(value)}")
    return value


def _list(value: object, path: str, limit: int) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise TemplateProblem(f"{path}: expected a list, got {described(value)}")
    if len(value) > limit:
        raise TemplateProblem(f"{path}: {len(value)} entries, more than {limit}")
    return value


def _models(selectors: list[Any], path: str) -> tuple[str, ...]:
    """The models of the chart's model selector; other selectors restrict nothing here."""
    for i, sel in enumerate(selectors):
        expression = _map(_map(sel, f"{path}[{i}]").get("cel"), f"{path}[{i}].cel").get("expression")
        if not isinstance(expression, str) or len(expression) > 4096:
            continue
        match = _MODEL_LIST.match(expression.strip())
        if match:
            models = tuple(m.strip('"') for m in match.group(1).split(", "))
            return models[:MAX_MODELS]
    return ()


def _our_request(request: Mapping[str, Any], path: str, names: ResourceNames) -> TemplateAsk | None:
    """The share a request of our DeviceClass asks; None for another class's request."""
    if any(
        isinstance(sub, dict) and sub.get("deviceClassName") == DRA_DEVICE_CLASS
        for sub in _list(request.get("firstAvailable"), f"{path}.firstAvailable", MAX_REQUESTS)
    ):
        raise TemplateProblem(
            f"{path}.firstAvailable: a prioritized list of {DRA_DEVICE_CLASS} is not scored"
        )
    exactly = _map(request.get("exactly"), f"{path}.exactly")
    if exactly.get("deviceClassName") != DRA_DEVICE_CLASS:
        return None
    mode = exactly.get("allocationMode", "ExactCount")
    count = exactly.get("count", 1)
    if mode != "ExactCount" or count != 1 or isinstance(count, bool):
        raise TemplateProblem(
            f"{path}.exactly: allocationMode {described(mode)} count {described(count)}; "
            "a slice is one share of one card (ExactCount, count 1)"
        )
    capacity = _map(_map(exactly.get("capacity"), f"{path}.exactly.capacity").get("requests"), "requests")
    if DRA_CAPACITY not in capacity:
        raise TemplateProblem(
            f"{path}.exactly.capacity.requests: no {DRA_CAPACITY}; the slice's size is unknown"
        )
    try:
        nbytes = memory_bytes(capacity[DRA_CAPACITY])
    except ValueError as err:
        raise TemplateProblem(f"{path}.exactly.capacity.requests.{DRA_CAPACITY}: {err}") from None
    selectors = _list(exactly.get("selectors"), f"{path}.exactly.selectors", MAX_SELECTORS)
    return TemplateAsk(units_of(nbytes, names), _models(selectors, f"{path}.exactly.selectors"))


def template_ask(obj: object, where: str, names: ResourceNames = DEFAULT_NAMES) -> TemplateAsk | None:
    """What ResourceClaimTemplate ``obj`` (API JSON; ``where`` names it) asks of our DeviceClass:
    None when it asks nothing of it; :class:`TemplateProblem` for a shape we cannot score."""
    try:
        spec = _map(_map(_map(obj, "template").get("spec"), "spec").get("spec"), "spec.spec")
        devices = _map(spec.get("devices"), "spec.spec.devices")
        path = "spec.spec.devices.requests"
        asks = [
            ask
            for i, item in enumerate(_list(devices.get("requests"), path, MAX_REQUESTS))
            if (ask := _our_request(_map(item, f"{path}[{i}]"), f"{path}[{i}]", names)) is not None
        ]
    except TemplateProblem as err:
        raise TemplateProblem(f"ResourceClaimTemplate {where}: {err}") from None
    if len(asks) > 1:
        raise TemplateProblem(
            f"ResourceClaimTemplate {where}: {len(asks)} requests of {DRA_DEVICE_CLASS}; a slice is one"
        )
    return asks[0] if asks else None


class ClaimTemplates:
    """Templates read through ``fetch`` (None: not found), cached briefly and bounded."""

    def __init__(
        self,
        fetch: Fetch,
        names: ResourceNames = DEFAULT_NAMES,
        ttl: float = TTL,
        limit: int = MAX_TEMPLATES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fetch = fetch
        self.names = names
        self.ttl = ttl
        self.limit = limit
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[float, TemplateAsk | None]] = {}

    async def ask(self, namespace: str, name: str) -> TemplateAsk | None:
        key = (namespace, name)
        now = self.clock()
        hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        where = f"{namespace}/{name}"
        ask: TemplateAsk | None = None
        try:
            raw = await self.fetch(namespace, name)
            if raw is None:
                log.info("ResourceClaimTemplate %s: not found; its pods get no GPU-memory score", where)
            else:
                ask = template_ask(raw, where, self.names)
        except TemplateProblem as err:
            log.warning("%s; its pods get no GPU-memory score", err)
        except Exception as err:  # the API server's trouble: the pod is placed without our score
            log.warning("ResourceClaimTemplate %s: cannot read it (%s); no GPU-memory score", where, err)
        self._cache.pop(key, None)
        while len(self._cache) >= self.limit:
            self._cache.pop(next(iter(self._cache)))
        self._cache[key] = (now, ask)
        return ask

    async def demand(self, pod: PodObject) -> Demand | None:
        """The slice a DRA pod claims, as a demand binpack can score; None for any other pod,
        and for a pod whose templates ask no share of our class or more than one."""
        if not pod.claims_dra_slice:
            return None
        namespace = pod.namespace or "default"
        names = list(dict.fromkeys(c.template_name for c in pod.resource_claims if c.template_name))
        asks = [a for n in names[:MAX_POD_TEMPLATES] if (a := await self.ask(namespace, n)) is not None]
        if len(asks) != 1:
            if asks:
                log.info("pod %s claims %d slices; it gets no GPU-memory score", pod.key, len(asks))
            return None
        return Demand(key=pod.key, uid=pod.uid, per_card=asks[0].units, count=1, models=asks[0].models)
