"""The readers of Pod and Node objects: raw API JSON in, typed :mod:`.objects` out. Pure.

The API server validates what it stores; a body sent to the extender's verbs (or any other door)
is whatever its sender wrote. Every door reads objects here before the core sees them:
:func:`read_pod` and :func:`read_node` check exactly the fields the core reads (their types, and
bounds on lists and strings), raise :class:`~gpushare_hub.core.errors.InvalidObject` naming the
first field that is wrong, what was expected and at most a short prefix of what came, and return
typed values, so that nothing downstream checks a type again. :func:`check_depth` bounds how
deeply a decoded JSON document nests. Extra fields are left alone: they are never read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import InvalidObject
from .objects import Address, Condition, Container, NodeObject, PodClaim, PodObject, Taint, Toleration

# Bounds a real object stays far inside (the API server stores at most 1.5 MiB per object).
MAX_CONTAINERS = 256  # per list (containers, initContainers)
MAX_MAP_ENTRIES = 1024  # labels, annotations, nodeSelector, limits, requests
MAX_NAME = 253  # a DNS subdomain; also a resource name, a label key's length
MAX_ANNOTATIONS_BYTES = 256 * 1024  # the API server's own limit on all of an object's annotations
MAX_CONDITIONS = 64
MAX_TAINTS = 64  # taints of a node, tolerations of a pod: what is past it is not read
MAX_POD_CLAIMS = 128  # spec.resourceClaims: a pod names a handful
MAX_DEPTH = 32  # a Pod nests about 10 deep
MAX_UID = 2**31 - 1  # the API server's bound on runAsUser
SHOWN = 40  # characters of an offending value echoed back


def shown(value: object) -> str:
    """A short, safe rendering of an offending value for a message."""
    text = repr(value)
    return text if len(text) <= SHOWN else text[:SHOWN] + "…"


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__
    )


def described(value: object) -> str:
    """What kind of value came, and its short rendering: ``a list [1, 2]``."""
    return f"{_kind(value)} {shown(value)}"


def _fail(path: str, expected: str, value: object) -> InvalidObject:
    return InvalidObject(f"{path}: expected {expected}, got {described(value)}")


def _object(value: object, path: str) -> Mapping[str, Any] | None:
    """An optional object: None where absent."""
    return None if value is None else _required(value, path)


def _required(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _fail(path, "an object", value)
    return value


def _string(value: object, path: str, limit: int = MAX_NAME) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise _fail(path, "a string", value)
    if len(value) > limit:
        raise InvalidObject(f"{path}: {len(value)} characters, more than {limit}")


def _string_map(value: object, path: str, value_limit: int = MAX_ANNOTATIONS_BYTES) -> None:
    m = _object(value, path)
    if m is None:
        return
    if len(m) > MAX_MAP_ENTRIES:
        raise InvalidObject(f"{path}: {len(m)} entries, more than {MAX_MAP_ENTRIES}")
    total = 0
    for key, item in m.items():
        _string(key, f"{path} key", 2 * MAX_NAME)
        if not isinstance(item, str):
            raise _fail(f"{path}[{shown(key)}]", "a string", item)
        total += len(key) + len(item)
    if total > value_limit:
        raise InvalidObject(f"{path}: {total} bytes in all, more than {value_limit}")


def _quantities(value: object, path: str) -> None:
    m = _object(value, path)
    if m is None:
        return
    if len(m) > MAX_MAP_ENTRIES:
        raise InvalidObject(f"{path}: {len(m)} entries, more than {MAX_MAP_ENTRIES}")
    for key, item in m.items():
        _string(key, f"{path} key")
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise _fail(f"{path}[{shown(key)}]", "a quantity (a string such as '5', or a number)", item)
        if isinstance(item, str) and len(item) > 64:
            raise InvalidObject(f"{path}[{shown(key)}]: a quantity of {len(item)} characters, more than 64")


def _list(value: object, path: str, limit: int) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(path, "a list", value)
    if len(value) > limit:
        raise InvalidObject(f"{path}: {len(value)} items, more than {limit}")
    return value


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _uid_value(value: object, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UID:
        raise _fail(path, f"a UID, a whole number from 0 to {MAX_UID}", value)
    return value


def _run_as_user(obj: Mapping[str, Any], path: str) -> int | None:
    context = _object(obj.get("securityContext"), f"{path}.securityContext")
    if context is None:
        return None
    return _uid_value(context.get("runAsUser"), f"{path}.securityContext.runAsUser")


def _metadata(obj: Mapping[str, Any], path: str, name_required: bool) -> Mapping[str, Any]:
    meta = _required(obj.get("metadata"), f"{path}.metadata")
    for key in ("name", "namespace", "uid", "generateName", "creationTimestamp", "deletionTimestamp"):
        _string(meta.get(key), f"{path}.metadata.{key}")
    if name_required and not meta.get("name"):
        raise InvalidObject(f"{path}.metadata.name: missing; give the object's name")
    _string_map(meta.get("labels"), f"{path}.metadata.labels")
    _string_map(meta.get("annotations"), f"{path}.metadata.annotations")
    return meta


def _container(c: object, where: str) -> Container:
    container = _required(c, where)
    _string(container.get("name"), f"{where}.name")
    _string(container.get("restartPolicy"), f"{where}.restartPolicy")
    resources = _object(container.get("resources"), f"{where}.resources") or {}
    _quantities(resources.get("limits"), f"{where}.resources.limits")
    _quantities(resources.get("requests"), f"{where}.resources.requests")
    return Container(
        name=container.get("name") or "?",
        restart_policy=_str(container.get("restartPolicy")),
        limits=dict(resources.get("limits") or {}),
        requests=dict(resources.get("requests") or {}),
        run_as_user=_run_as_user(container, where),
    )


def _pod_claims(value: object, path: str) -> tuple[PodClaim, ...]:
    """``spec.resourceClaims``: a bounded list of objects whose name and source are strings."""
    keys = ("name", "resourceClaimName", "resourceClaimTemplateName")
    claims = []
    for i, c in enumerate(_list(value, path, MAX_POD_CLAIMS)):
        claim = _required(c, f"{path}[{i}]")
        for key in keys:
            _string(claim.get(key), f"{path}[{i}].{key}")
        claims.append(PodClaim(*(_str(claim.get(k)) for k in keys)))
    return tuple(claims)


def _lenient(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _entries(value: object, keys: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Taints or tolerations, read leniently (the scheduler's business, not a reason to refuse
    an object): string fields of the first :data:`MAX_TAINTS` entries that are objects."""
    out = []
    for entry in value[:MAX_TAINTS] if isinstance(value, list) else []:
        if isinstance(entry, Mapping):
            out.append(tuple(v if isinstance(v := entry.get(k), str) else "" for k in keys))
    return out


def read_pod(obj: object, path: str = "Pod") -> PodObject:
    """The Pod fields the core reads, checked and typed; :class:`InvalidObject` names the first
    wrong one. Objects from the API server always pass; what a door receives may not."""
    pod = _required(obj, path)
    meta = _metadata(pod, path, name_required=False)
    spec = _object(pod.get("spec"), f"{path}.spec") or {}
    for key in ("nodeName", "schedulerName", "priorityClassName"):
        _string(spec.get(key), f"{path}.spec.{key}")
    _string_map(spec.get("nodeSelector"), f"{path}.spec.nodeSelector")
    lists = {
        field: tuple(
            _container(c, f"{path}.spec.{field}[{i}]")
            for i, c in enumerate(_list(spec.get(field), f"{path}.spec.{field}", MAX_CONTAINERS))
        )
        for field in ("initContainers", "containers")
    }
    status = _object(pod.get("status"), f"{path}.status") or {}
    for key in ("phase", "startTime"):
        _string(status.get(key), f"{path}.status.{key}")
    conditions = []
    for i, cond in enumerate(_list(status.get("conditions"), f"{path}.status.conditions", MAX_CONDITIONS)):
        c = _required(cond, f"{path}.status.conditions[{i}]")
        for key in ("type", "status", "reason", "lastTransitionTime"):
            _string(c.get(key), f"{path}.status.conditions[{i}].{key}")
        _string(c.get("message"), f"{path}.status.conditions[{i}].message", 32 * 1024)
        keys = ("type", "status", "reason", "message", "lastTransitionTime")
        conditions.append(Condition(*(_str(c.get(k)) for k in keys)))
    return PodObject(
        name=_str(meta.get("name")),
        namespace=_str(meta.get("namespace")),
        uid=_str(meta.get("uid")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        creation_timestamp=_str(meta.get("creationTimestamp")),
        deletion_timestamp=_str(meta.get("deletionTimestamp")),
        node_name=_str(spec.get("nodeName")),
        scheduler_name=_str(spec.get("schedulerName")),
        node_selector=dict(spec.get("nodeSelector") or {}),
        init_containers=lists["initContainers"],
        containers=lists["containers"],
        run_as_user=_run_as_user(spec, f"{path}.spec"),
        phase=_str(status.get("phase")),
        start_time=_str(status.get("startTime")),
        conditions=tuple(conditions),
        resource_claims=_pod_claims(spec.get("resourceClaims"), f"{path}.spec.resourceClaims"),
        tolerations=tuple(
            Toleration(*e) for e in _entries(spec.get("tolerations"), ("key", "operator", "value", "effect"))
        ),
    )


def read_node(obj: object, path: str = "Node") -> NodeObject:
    """The Node fields the core reads, checked and typed (name required)."""
    node = _required(obj, path)
    meta = _metadata(node, path, name_required=True)
    status = _object(node.get("status"), f"{path}.status") or {}
    _quantities(status.get("capacity"), f"{path}.status.capacity")
    _quantities(status.get("allocatable"), f"{path}.status.allocatable")
    addresses = []
    for i, a in enumerate(_list(status.get("addresses"), f"{path}.status.addresses", MAX_CONDITIONS)):
        addr = _required(a, f"{path}.status.addresses[{i}]")
        for key in ("type", "address"):
            _string(addr.get(key), f"{path}.status.addresses[{i}].{key}")
        addresses.append(Address(_str(addr.get("type")), _str(addr.get("address"))))
    return NodeObject(
        name=meta["name"],
        uid=_str(meta.get("uid")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        capacity=dict(status.get("capacity") or {}),
        allocatable=dict(status.get("allocatable") or {}),
        addresses=tuple(addresses),
        taints=tuple(
            Taint(*e) for e in _entries(_lenient(node.get("spec")).get("taints"), ("key", "value", "effect"))
        ),
    )


_CONTAINERS = frozenset({dict, list})


def check_depth(value: object, limit: int = MAX_DEPTH) -> None:
    """:class:`InvalidObject` if ``value`` (decoded JSON) nests more than ``limit`` levels."""
    if not isinstance(value, dict | list):
        return
    stack: list[tuple[dict[object, object] | list[object], int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise InvalidObject(f"the body nests deeper than {limit} levels; no valid request does")
        children = item.values() if isinstance(item, dict) else item
        # Only containers go on the stack; a list of a thousand node names is one pass in C.
        if _CONTAINERS.isdisjoint(set(map(type, children))):
            continue
        stack.extend([(child, depth + 1) for child in children if isinstance(child, dict | list)])
