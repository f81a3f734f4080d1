"""Pods from the API server (a list, a reflector's cache) read into the core's typed form,
leaving out, with the field named in the log, any that cannot be read. The API server validates
what it stores, so such a pod means a bug elsewhere; it must not stop the reading of the others."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from gpushare_hub.core.errors import InvalidObject
from gpushare_hub.core.objects import PodObject, pod_key
from gpushare_hub.core.shapes import read_pod

Log = logging.Logger | logging.LoggerAdapter[Any]


def readable_pod(obj: Mapping[str, Any], log: Log) -> PodObject | None:
    """``obj`` read, or None with a warning naming the pod and the field."""
    try:
        return read_pod(obj)
    except InvalidObject as err:
        log.warning("pod %s left out: %s", pod_key(obj), err)
        return None


def readable_pods(objs: Iterable[Mapping[str, Any]], log: Log) -> list[PodObject]:
    """The pods of ``objs`` that can be read (see :func:`readable_pod`)."""
    return [p for p in (readable_pod(obj, log) for obj in objs) if p is not None]
