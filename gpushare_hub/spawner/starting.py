"""Start and progress: KubeSpawner's start raced against the checks that the pod can ever fit
and that its notebook has not already ended, and the progress page's words about the GPU."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from traitlets import Float

from .dra import DRA, user_words
from .exits import NotebookExited, event_uid, later_events, notebook_exit
from .ledgerview import LedgerView
from .options import Reason, Refused
from .progress import Bound, NeverFits, spawn_status
from .progress import render as render_status
from .refused import SpawnRefused


class SpawnStart(LedgerView):
    """``start``, ``progress`` and ``status_message``."""

    never_fits_check_interval = Float(
        2.0,
        config=True,
        help="Seconds between checks, while a server's pod starts, of whether it can ever fit and "
        "whether its notebook command has already ended (either ends the spawn with the reason).",
    )

    def start(self) -> asyncio.Future[Any]:
        """KubeSpawner's start, raced against checks that the pod can ever fit and that its
        notebook command has not already ended."""
        # A pod already there is an earlier spawn's (KubeSpawner deletes it before creating its own).
        self._start_future = asyncio.ensure_future(self._start_watched(self._raw_pod()))
        return self._start_future

    async def _start_watched(self, before: Mapping[str, Any] | None = None) -> Any:
        inner = asyncio.ensure_future(self._start())
        watchers = {
            asyncio.ensure_future(self._watch_never_fits()),
            asyncio.ensure_future(self._watch_exit(before)),
        }
        try:
            done, _ = await asyncio.wait({inner, *watchers}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled from outside: take KubeSpawner's start down too
            inner.cancel()
            raise
        finally:
            for watcher in watchers:
                watcher.cancel()
        if inner not in done:
            inner.cancel()
            await asyncio.gather(inner, return_exceptions=True)
            for watcher in done:
                watcher.result()  # raises the refusal, or why the notebook ended
        return inner.result()

    async def _watch_exit(self, before: Mapping[str, Any] | None) -> None:
        """Fail the spawn as soon as the new pod shows that its notebook command ended (a pod of an
        earlier spawn, ``before``, which KubeSpawner deletes first, is not this spawn's)."""
        old_uid = ((before or {}).get("metadata") or {}).get("uid")
        while True:
            await asyncio.sleep(self.never_fits_check_interval)
            pod = self._raw_pod()
            if pod is None or (pod.get("metadata") or {}).get("uid") == old_uid:
                continue
            sentence = notebook_exit(pod)
            if sentence is not None:
                raise NotebookExited(sentence)

    async def _watch_never_fits(self) -> None:
        """Fail the spawn as soon as the ledger says this pod can never be placed."""
        while True:
            await asyncio.sleep(self.never_fits_check_interval)
            ledger = self._ledger()
            pod = self._pod_object()
            if ledger is None or pod is None:
                continue
            status = spawn_status(ledger, pod)
            if isinstance(status, NeverFits):
                raise SpawnRefused(Refused(Reason.NEVER_FITS, render_status(status)))

    def status_message(self) -> str | None:
        """What the progress page shows about the GPU right now (``None``: nothing to say)."""
        pod = self._pod_object()
        if pod is None:
            return None
        ledger = self._ledger()
        if ledger is None:
            from gpushare_hub.core import Ledger

            ledger = Ledger(self.resource_names)  # a bound pod still says where it went
        status = spawn_status(ledger, pod, self._queue(), type(self)._releases, time.monotonic())
        if status is None or (self._ledger() is None and not isinstance(status, Bound)):
            return None
        return render_status(status)

    def _dra_words(self, event: Mapping[str, Any]) -> str | None:
        """On the DRA path, what a Kubernetes event about the pod's claim means for the user."""
        chosen = self._gpushare_chosen
        if self.allocation != DRA or chosen is None:
            return None
        raw = event.get("raw_event")
        message = raw.get("message") if isinstance(raw, Mapping) else event.get("message")
        return user_words(message, chosen) if isinstance(message, str) else None

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        """KubeSpawner's events, interleaved with why the GPU pod waits or where it went."""
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

        async def pump() -> None:
            try:
                async for event in super(SpawnStart, self).progress():
                    await queue.put(event)
            finally:
                await queue.put(None)

        task = asyncio.ensure_future(pump())
        last: str | None = None
        events_done = False
        seen: set[str] = set()  # the pod's events already shown
        try:
            while True:
                if not events_done:
                    try:
                        event = await asyncio.wait_for(queue.get(), timeout=1.0)
                    except TimeoutError:
                        event = {}
                    if event is None:
                        events_done = True
                    elif event:
                        seen.add(event_uid(event.get("raw_event")))
                        yield event
                        note = self._dra_words(event)
                        if note and note != last:
                            last = note
                            yield {"message": note}
                else:
                    await asyncio.sleep(1.0)
                message = self.status_message()
                if message and message != last:
                    last = message
                    yield {"message": message}
                future = self._start_future
                if events_done and (future is None or future.done()):
                    if not self._waiting_for_server(future):
                        break
                    # The pod was seen Running and the hub now waits for the server to answer
                    # (http_timeout): what happens to the pod meanwhile (its command exiting) is
                    # still the user's to read, until the hub gives up or the server answers.
                    for shown in later_events(self.events, seen):
                        yield shown
        finally:
            task.cancel()

    def _waiting_for_server(self, future: asyncio.Future[Any] | None) -> bool:
        """KubeSpawner's start returned and the spawn still waits (for the server's first answer)."""
        return (
            future is not None
            and future.done()
            and not future.cancelled()
            and future.exception() is None
            and bool(getattr(self, "_spawn_pending", False))
        )
