"""The cluster as this hub process sees it: the shared ledger (or the admin's provider), the
releases behind the waiting estimates, this server's pod and the queue from KubeSpawner's
reflector, and what each slice's availability is now."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from traitlets import Bool, Callable, Float

from gpushare_hub.core import PodObject
from gpushare_hub.core.availability import Availability, availability
from gpushare_hub.core.catalogue import Slice
from gpushare_hub.core.releases import ReleaseHistory
from gpushare_hub.kube.ledger_source import Informer, SharedLedger
from gpushare_hub.kube.reading import readable_pod, readable_pods

from .settings import SliceSettings


class LedgerView(SliceSettings):
    """``ledger_provider``, ``watch_ledger``: the ledger the form, the checks and the progress read."""

    queue_estimate_after = Float(
        600.0,
        min=0,
        config=True,
        help="""
        Seconds this hub process must have watched the cluster before a waiting spawn (its
        progress page, and the form beside a full slice) gets an estimate of its wait, made from
        how often slices as large were released lately (6 h at most). No estimate is shown
        before, nor with fewer than two such releases.
        """,
    )

    ledger_provider = Callable(
        None,
        allow_none=True,
        config=True,
        help="""
        A callable returning the current ``gpushare_hub.core.Ledger``, or ``None`` while it is
        not known. The form's availability, ``when_unavailable``, the progress messages and the
        early failure of pods that never fit read it; while it returns ``None`` availability is
        shown as unknown and spawns are not held back. Default (``None`` here): the hub
        process's one shared watch of Nodes and Pods (see ``watch_ledger``).
        """,
    )

    watch_ledger = Bool(
        True,
        config=True,
        help="""
        Without a ``ledger_provider``, keep one ledger in the hub process from a watch of the
        API server's Nodes and Pods (the extender's informer), started on first use. The hub's
        service account then needs ``list`` and ``watch`` on nodes and on pods in all namespaces.
        """,
    )

    ledger_max_staleness = Float(
        30.0,
        config=True,
        help="""
        Seconds a failing watch may go on before its ledger is no longer trusted (availability
        is then shown as unknown until the watch recovers).
        """,
    )

    _shared_ledger: SharedLedger | None = None
    # Allocations that ended, seen by this hub process's watch: the waiting spawns' estimates.
    _releases: ReleaseHistory | None = None

    def _ledger(self) -> Any:
        if self.ledger_provider is not None:
            return self.ledger_provider()
        shared = type(self)._shared_ledger
        return shared() if shared is not None and self.watch_ledger else None

    def _make_informer(self) -> Informer:
        from functools import partial

        from gpushare_hub.core.reportfacts import may_hold_slice
        from gpushare_hub.kube.informer import LedgerInformer

        # The ledger reads every pod event; only pods that can hold a slice are remembered.
        keep = partial(may_hold_slice, names=self.resource_names)
        cls = type(self)
        if cls._releases is None:  # one history for every informer of this process (relists too)
            cls._releases = ReleaseHistory(started=time.monotonic(), min_span=self.queue_estimate_after)
        return LedgerInformer(self.api.api_client, self.resource_names, keep_pod=keep, releases=cls._releases)

    async def ensure_ledger(self) -> None:
        """Start the shared watch on first use (when no ``ledger_provider`` is configured)."""
        cls = type(self)
        if self.ledger_provider is not None or not self.watch_ledger:
            return
        if cls._shared_ledger is None:
            cls._shared_ledger = SharedLedger(self._make_informer, self.ledger_max_staleness)
        await cls._shared_ledger.ensure_started()

    def _pod_object(self) -> PodObject | None:
        """This server's pod from KubeSpawner's reflector, read (None while there is none)."""
        reflector = self.pod_reflector
        if reflector is None:
            return None
        pod: Mapping[str, Any] | None = reflector.pods.get(f"{self.namespace}/{self.pod_name}")
        return readable_pod(pod, self.log) if pod is not None else None

    def _queue(self) -> Sequence[PodObject]:
        reflector = self.pod_reflector
        pods = list(reflector.pods.values()) if reflector is not None else []
        return readable_pods(pods, self.log)

    def _raw_pod(self) -> Mapping[str, Any] | None:
        """This server's pod as the reflector holds it (API JSON), or None."""
        reflector = self.pod_reflector
        return reflector.pods.get(f"{self.namespace}/{self.pod_name}") if reflector is not None else None

    def availability_of(self, s: Slice) -> Availability | None:
        ledger = self._ledger()
        if ledger is None:
            return None
        return availability(ledger, s.demand(), {**self.node_selector, **self.gpu_node_selector})
