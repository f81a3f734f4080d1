"""Hibernation inside the notebook server: idle kernels give their GPU memory back, and wake.

The Jupyter server extension runs as the user, in the container, beside its kernels. A
:class:`Hibernator` finds each kernel's GPU processes (the kernel's process and its descendants
that have an entry in the container ledger, :mod:`_gpushare_hub_ledger`), and:

* **hibernates** a kernel (:meth:`hibernate`): lock every GPU process, checkpoint each (CUDA's
  process checkpoint, :mod:`gpushare_hub.isolation.checkpoint`), then mark each hibernated in the
  ledger (:mod:`_gpushare_hub_hibernation`), which counts it at 0 so that the server's other
  kernels may use its memory. A process the driver refuses (an MPS client, a driver without the
  API, ...) rolls the kernel back awake, and the kernel is ``refused`` with the driver's words
  until it runs something new;
* **wakes** a kernel (:meth:`wake`), in the order asked: first its memory must fit back inside the
  slice beside what the awake processes hold (else it waits, saying for what), then the driver
  restores each process (a card without the room answers out-of-memory: it waits again), then
  unlocks them and the ledger counts them again;
* on each :meth:`tick`, hibernates the kernels idle past the hub's ``hibernate_after`` (a kernel
  kept awake, busy, or refused for its current work is left alone), and wakes a hibernated kernel
  that turned busy some other way than a cell sent through the websocket.

Every driver call runs in a thread: a real checkpoint takes seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpushare_hub.core import cardmemory
from gpushare_hub.core.names import LEDGER_DIR_ENV
from gpushare_hub.isolation.checkpoint import Checkpointer, CheckpointError
from gpushare_hub.isolation.processtree import descendants

from .door import NO_ANSWER, UNKNOWN, Door
from .hostroom import no_room
from .overslice import hibernation_module, ledger_module
from .sleepstate import (
    AWAKE,
    HIBERNATED,
    HIBERNATING,
    REFUSED,
    WAITING,
    WAKING,
    KernelSleep,
    Process,
    gib,
    refusal_words,
)

log = logging.getLogger("gpushare.hibernation")
LIMIT_ENV = "GPUSHARE_MEMORY_LIMIT_MIB"  # the slice, as the start-up hook reads it
CARD_ENV = "GPUSHARE_CARD_MEMORY_MIB"  # its card, as NVML gives it
RETRY_S = 1.0
FRESH_S = 1.5  # three of the container ledger's publication intervals (0.5 s)


class Hibernator:
    """The hibernation of one notebook server's kernels."""

    def __init__(
        self,
        kernels: Any,  # Jupyter Server's MappingKernelManager
        driver: Checkpointer,
        env: Mapping[str, str],
        clock: Callable[[], float] = time.time,
        proc: str = "/proc",
        cgroup: str = "/sys/fs/cgroup",
    ) -> None:
        self.kernels = kernels
        self.driver = driver
        self.folder = env.get(LEDGER_DIR_ENV, "").strip()
        limit = env.get(LIMIT_ENV, "").strip()
        self.slice_bytes = int(limit) << 20 if limit.isdigit() else 0
        # What the ledger's entries (each with its process's CUDA context) must fit in: the slice's
        # part of what CUDA gives of the card (core/cardmemory.py), as the start-up hook counts it.
        card, cuda = (env.get(k, "").strip() for k in (CARD_ENV, cardmemory.CARD_CUDA_ENV))
        self.room_bytes = self.slice_bytes
        if self.slice_bytes and card.isdigit() and cuda.isdigit():
            self.room_bytes = cardmemory.usable_mib(int(limit), int(card), int(cuda)) << 20
        self.clock = clock
        self.proc = proc
        self.cgroup = Path(cgroup)  # the container's memory cgroup: room for the copies
        self.sleeps: dict[str, KernelSleep] = {}
        self.door = Door.from_env(env)  # on nodes that overcommit: wakes need the plugin's grant
        self.line: list[str] = []  # kernels waiting to wake, in the order asked
        self._locks: dict[str, asyncio.Lock] = {}
        self._restore = asyncio.Lock()  # one wake restores at a time, in the order asked
        self._tasks: set[asyncio.Future[Any]] = set()

    def wake_soon(self, kernel_id: str) -> asyncio.Future[KernelSleep]:
        """Start waking the kernel (in the background; kept until done)."""
        task = asyncio.ensure_future(self.wake(kernel_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- reading ---------------------------------------------------------------------------
    def sleep_of(self, kernel_id: str) -> KernelSleep:
        if kernel_id not in self.sleeps:
            self.sleeps[kernel_id] = KernelSleep(kernel_id)
        return self.sleeps[kernel_id]

    def _lock(self, kernel_id: str) -> asyncio.Lock:
        return self._locks.setdefault(kernel_id, asyncio.Lock())

    def kernel(self, kernel_id: str) -> Any:
        try:
            return self.kernels.get_kernel(kernel_id)
        except KeyError:
            return None

    def kernel_pid(self, kernel_id: str) -> int | None:
        k = self.kernel(kernel_id)
        pid = getattr(getattr(k, "provisioner", None), "pid", None)
        return pid if isinstance(pid, int) and pid > 0 else None

    def gpu_processes(self, kernel_id: str) -> list[Process]:
        """The kernel's processes that hold GPU memory now, by the container ledger."""
        pid = self.kernel_pid(kernel_id)
        if pid is None or not self.folder:
            return []
        module = ledger_module()
        if module is None:
            return []
        mine = {pid, *descendants(pid, self.proc)}
        out = []
        for p, held, what in module.read_others(self.folder, 0, self.proc):
            start = module.start_time(p, self.proc)
            if p in mine and held > 0 and start:
                out.append(Process(p, start, held, what))
        return out

    def awake_elsewhere(self, kernel_id: str) -> list[tuple[int, str]]:
        """(bytes, what) held by the server's awake GPU processes outside this kernel."""
        asleep = {p.pid for p in self.sleep_of(kernel_id).processes}
        return [(h, w) for p, h, w in self.awake_processes() if p not in asleep]

    def awake_processes(self) -> list[tuple[int, int, str]]:
        """(pid, bytes, what) of the server's GPU processes that hold memory on the card."""
        module = ledger_module()
        if module is None or not self.folder:
            return []
        return [(p, h, w) for p, h, w in module.read_others(self.folder, 0, self.proc) if h > 0]

    def _neighbours(self, kernel_id: str) -> bool:
        """Whether the server has GPU processes outside this kernel, holding memory or not yet."""
        module = ledger_module()
        if module is None or not self.folder:
            return False
        mine = {p.pid for p in self.sleep_of(kernel_id).processes}
        return any(p not in mine for p, _h, _w in module.read_others(self.folder, 0, self.proc))

    # ---- hibernating -----------------------------------------------------------------------
    async def hibernate(self, kernel_id: str) -> KernelSleep:
        """Checkpoint the kernel's GPU processes (nothing to do when it holds nothing)."""
        sleep = self.sleep_of(kernel_id)
        async with self._lock(kernel_id):
            k = self.kernel(kernel_id)
            if sleep.state not in (AWAKE, REFUSED) or k is None:
                return sleep
            if getattr(k, "execution_state", "") == "busy":
                return sleep
            found = self.gpu_processes(kernel_id)
            if not found:
                return sleep
            cramped = no_room(sum(p.held for p in found), self.cgroup)
            if cramped:
                sleep.state, sleep.why = REFUSED, cramped
                sleep.refused_activity = str(getattr(k, "last_activity", ""))
                return sleep
            sleep.state, sleep.why = HIBERNATING, ""
            locked: list[Process] = []
            done: list[Process] = []
            try:
                for p in found:
                    await asyncio.to_thread(self.driver.lock, p.pid)
                    locked.append(p)
                for p in found:
                    await asyncio.to_thread(self.driver.checkpoint, p.pid)
                    done.append(p)
            except CheckpointError as err:
                await self._roll_back(done, locked)
                sleep.state, sleep.why = REFUSED, refusal_words(err)
                sleep.refused_activity = str(getattr(k, "last_activity", ""))
                log.warning("gpushare: kernel %s stays awake: %s", kernel_id, err)
                return sleep
            now = self.clock()
            module = hibernation_module()
            for p in found:
                if module is not None:
                    with contextlib.suppress(OSError):
                        module.mark_hibernated(self.folder, p.pid, p.start, p.held, int(now))
            sleep.state, sleep.since, sleep.processes = HIBERNATED, now, found
            log.info("gpushare: kernel %s hibernated (%s moved to host memory)", kernel_id, gib(sleep.held))
            return sleep

    async def _roll_back(self, done: list[Process], locked: list[Process]) -> None:
        for p in done:
            with contextlib.suppress(CheckpointError):
                await asyncio.to_thread(self.driver.restore, p.pid)
        for p in locked:
            with contextlib.suppress(CheckpointError):
                await asyncio.to_thread(self.driver.unlock, p.pid)

    # ---- waking ----------------------------------------------------------------------------
    async def wake(self, kernel_id: str) -> KernelSleep:
        """Restore the kernel's GPU processes once their memory fits; returns when it is awake."""
        sleep = self.sleep_of(kernel_id)
        if sleep.state not in (HIBERNATED, HIBERNATING, WAKING, WAITING):
            return sleep
        if kernel_id not in self.line:
            self.line.append(kernel_id)
        try:
            async with self._lock(kernel_id):
                if sleep.state != HIBERNATED:
                    return sleep
                sleep.state = WAITING
                while True:
                    self._places()
                    blocker = self._inside_slice(kernel_id) or self._not_granted(sleep.why)
                    if not blocker and self._neighbours(kernel_id):
                        # The ledger's entries are up to a publication interval old (more on a
                        # loaded machine): what another process took just now shows only then.
                        await asyncio.sleep(FRESH_S)
                        blocker = self._inside_slice(kernel_id)
                    if blocker:
                        sleep.state, sleep.why = WAITING, blocker
                    elif self.line[0] == kernel_id:
                        async with self._restore:
                            sleep.state = WAKING
                            refused = await self._restore_all(sleep)
                        if not refused:
                            break
                        sleep.state, sleep.why = WAITING, refused
                    else:
                        sleep.state = WAITING
                        ahead = sleep.place - 1 if sleep.place else 0
                        sleep.why = f"waiting to wake: {ahead} kernel(s) of this server first"
                    await asyncio.sleep(RETRY_S)
                module = hibernation_module()
                for p in sleep.processes:
                    if module is not None:
                        module.unmark_hibernated(self.folder, p.pid)
                log.info("gpushare: kernel %s woken (%s back on the card)", kernel_id, gib(sleep.held))
                sleep.state, sleep.since, sleep.processes, sleep.why, sleep.place = AWAKE, None, [], "", None
                return sleep
        finally:
            with contextlib.suppress(ValueError):
                self.line.remove(kernel_id)
            self._places()

    def _not_granted(self, said: str = "") -> str:
        """Words for why the node's plugin has not granted the wake yet, or ``""`` (granted, the
        server's slice still counts awake, or the node does not overcommit). While the plugin
        has not answered the latest ask, what it ``said`` before stands."""
        if self.door is None:
            return ""
        from .idleloop import tell_door

        tell_door(self, self.clock())
        answer = self.door.answer()
        if answer.state == "awake" or answer.grant:
            return ""
        if answer.state == UNKNOWN:
            return said or answer.words or NO_ANSWER
        return answer.words or "waiting for the node to grant the room on your card"

    def _places(self) -> None:
        for i, kid in enumerate(self.line):
            self.sleep_of(kid).place = i + 1

    def _inside_slice(self, kernel_id: str) -> str:
        """Words for why the kernel's memory does not fit back in the slice yet, or ``""``."""
        sleep = self.sleep_of(kernel_id)
        if not self.slice_bytes:
            return ""
        others = self.awake_elsewhere(kernel_id)
        used = sum(h for h, _w in others)
        if used + sleep.held <= self.room_bytes:
            return ""
        names = ", ".join(f"{w} {gib(h)}" for h, w in sorted(others, reverse=True)[:3])
        counted = ", CUDA contexts included" if self.room_bytes < self.slice_bytes else ""
        return (
            f"waiting for {gib(sleep.held)} inside your {gib(self.slice_bytes)} slice: your other "
            f"GPU processes hold {gib(used)}{counted} ({names}); free that memory, or hibernate or "
            "stop them"
        )

    async def _restore_all(self, sleep: KernelSleep) -> str:
        """Restore then unlock each process; words when the card has no room yet (none restored
        stays half-way: what was restored is checkpointed again)."""
        restored: list[Process] = []
        for p in sleep.processes:
            try:
                await asyncio.to_thread(self.driver.restore, p.pid)
            except CheckpointError as err:
                for q in restored:
                    with contextlib.suppress(CheckpointError):
                        await asyncio.to_thread(self.driver.checkpoint, q.pid)
                if err.out_of_memory:
                    return f"waiting for {gib(sleep.held)} on your card: it is full ({err})"
                return f"cannot wake yet: {err}"
            restored.append(p)
        for p in sleep.processes:
            with contextlib.suppress(CheckpointError):
                await asyncio.to_thread(self.driver.unlock, p.pid)
        return ""

    # ---- the idle loop (idleloop.py) ------------------------------------------------------
    async def tick(self, after_seconds: int | None) -> None:
        """Hibernate the kernels idle past ``after_seconds`` (None: hibernation is off for this
        server), wake hibernated ones that turned busy, and answer the node's door."""
        from .idleloop import tick

        await tick(self, after_seconds)
