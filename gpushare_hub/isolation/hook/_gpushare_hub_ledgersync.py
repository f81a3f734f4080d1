"""gpushare-hub's container ledger, kept current: entries fresh when a cap is taken, caps that follow.

Part of the start-up hook: ``_gpushare_hub_caps.py`` beside it loads this file (and the ledger,
``_gpushare_hub_ledger.py``) when a framework starts using the GPU. A process's cap is the slice
less what the container's other GPU processes published, so how fresh their entries are when it
takes its cap decides whether two processes together can pass the slice: two processes started
back to back both took 3 GiB of a 5 GiB slice when each published only every half second
(issue 47). :class:`LiveLedger` closes that window:

* **A start counts what was allocated before it.** When a framework starts (:meth:`LiveLedger.begin`:
  PyTorch's CUDA start, CuPy's first allocation, JAX's import) its process takes the folder's start
  lock (``start.lock``, an ``flock``), writes its entry at once (holding what it holds, 0 at first),
  asks every other live process to publish now (``<pid>.sync``: a token, the time of the request)
  and waits until each of their entries carries that token: its cap counts what they hold then.
* **Starts take turns.** It keeps the start lock until its own first allocation is published, so
  of two processes started back to back (``python -m gpushare_hub.demo.fakealloc 3``, twice) the
  second takes its cap after the first one's allocation, and is refused what would pass the slice.
* **Caps follow at once.** Every process looks at the folder every :data:`TICK` s (one ``stat``):
  when an entry or a request changed it, it answers the request (publishes what it holds) and
  takes its cap again, so a running process's cap shrinks within a tick of a neighbour's
  publication. What it holds is read every :data:`INTERVAL` s, and published when it changed.

Every wait is bounded (:data:`LOCK_WAIT`, :data:`SYNC_WAIT`, :data:`START_HOLD`): a process that
keeps the lock or never answers (a stopped one, a user's own file) delays a start, never stops
it, and an entry without a token (an older hook's) is not waited for. What stays open: two
processes, both past their start, that allocate within the same :data:`INTERVAL` can pass the
slice together until the next publication lowers their caps (the device plugin's measurement of
the pod still sees it). A process with two frameworks (PyTorch and CuPy) has one entry, their
sum and its CUDA context (:meth:`LiveLedger.context`); each framework's cap is the process's cap
less what its other frameworks and its context hold.

Standard library only, Python 3.8 or later, as the hook; nothing here raises into the user's code.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Mapping  # noqa: UP035 - Python 3.8

    from gpushare_hub.isolation.hook import _gpushare_hub_ledger as ledger
    from gpushare_hub.isolation.hook._gpushare_hub_ledger import Entry
else:  # loaded by _gpushare_hub_caps.py before this module
    import _gpushare_hub_ledger as ledger

INTERVAL = 0.5  # how often a running process reads what it holds (published when it changed), in s
TICK = 0.05  # how often it looks at the folder for a neighbour's publication or request
START_TICK = 0.01  # ... while it starts (waiting for the lock, for answers, for its first allocation)
LOCK_WAIT = 2.0  # the longest a start waits for the start lock
SYNC_WAIT = 1.0  # ... for the others' answers
START_HOLD = 1.0  # the longest a start keeps the lock, waiting for its first allocation
LOCK_FILE = "start.lock"
SYNC, _debug = ledger.SYNC, ledger._debug


class _Holder:
    """One framework of this process: what it holds (``held()``) and how its cap is set."""

    def __init__(
        self, held: Callable[[], int], apply: Callable[[int], object] | None, applied: int | None
    ) -> None:
        self.held, self.apply, self.applied, self.last = held, apply, applied, 0
        self.context = 0  # the bytes of the process's CUDA context this holder stands for


class LiveLedger(ledger.Ledger):
    """This process's place in its container's ledger, kept current (see the module's docstring)."""

    def __init__(self, slice_bytes: int, env: Mapping[str, str] | None = None, proc: str = "/proc") -> None:
        super().__init__(slice_bytes, env, proc)
        self.holders: list[_Holder] = []
        self._thread: threading.Thread | None = None
        self._start_lock: int | None = None  # the start lock's descriptor, while held
        self._hold_until, self._held_at_begin, self._seen = 0.0, 0, 0

    def context(self, nbytes: int) -> None:
        """This process keeps ``nbytes`` for its CUDA context outside any framework's allocator: it
        counts in the process's entry from its start, and every framework's cap leaves it room."""
        if nbytes > 0 and os.getpid() == self.pid and not any(h.context for h in self.holders):
            holder = _Holder(lambda: nbytes, None, None)
            holder.context = holder.last = nbytes
            self.holders.append(holder)
            self.held += nbytes

    def forget(self) -> None:
        super().forget()
        if os.getpid() == self.pid:
            self._release()

    def begin(self, hold: bool = True) -> int:
        """A framework of this process starts: what it may take, the slice less what the others
        hold now and this process's other frameworks hold. Takes the start lock, publishes this
        process's entry, asks the others to publish and waits for their answers (every wait
        bounded); with ``hold`` the lock is kept until this process's next allocation is published
        (:data:`START_HOLD` s at most), so that the next process to start counts it."""
        entries = None
        if os.getpid() == self.pid and not self._closed:
            try:
                entries = self._begin()
            except Exception as err:
                _debug(f"begin: {err!r}")
            self._held_at_begin, self._hold_until = self.held, time.monotonic() + START_HOLD
            if not hold:
                self._release()
            self._run()  # from now on it answers the others' requests (and lets the lock go)
        return max(0, self.cap(entries) - self.held)

    def _begin(self) -> list[Entry]:
        self._take_start_lock()
        token = time.time_ns()
        self.sync = max(self.sync, token)
        self.publish(self.held)
        request = f"{self.pid}{SYNC}"
        asking = self._put(request, {"pid": self.pid, "start": self.start, "sync": token})
        deadline = time.monotonic() + SYNC_WAIT
        try:
            while True:
                found, _asked = self._scan()
                late = [pid for pid, _held, _what, answered in found if 0 <= answered < token]
                if not (asking and late) or time.monotonic() >= deadline:
                    if asking and late:
                        _debug(f"no answer from {late} in {SYNC_WAIT} s: their entries may be old")
                    break
                time.sleep(START_TICK)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.path, request))
        return [(pid, held, what) for pid, held, what, _answered in found]

    def _take_start_lock(self) -> None:
        if self._start_lock is not None:
            return
        try:
            import fcntl

            self._folder()
            path = os.path.join(self.path, LOCK_FILE)
            flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
            try:  # opened, not created, where it exists: another user's file in a sticky folder
                fd = os.open(path, flags)
            except FileNotFoundError:
                fd = os.open(path, flags | os.O_CREAT, ledger.ENTRY_MODE)
            deadline = time.monotonic() + LOCK_WAIT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._start_lock = fd
                    return
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        os.close(fd)
                        _debug(f"{path} is held past {LOCK_WAIT} s: starting without it")
                        return
                time.sleep(START_TICK)
        except Exception as err:
            _debug(f"starting without the start lock: {err!r}")

    def _release(self) -> None:
        with self._lock:
            fd, self._start_lock = self._start_lock, None
        if fd is not None:
            with contextlib.suppress(Exception):
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_UN)  # for a forked child's copy of the descriptor too
            with contextlib.suppress(OSError):
                os.close(fd)

    def follow(
        self,
        held: Callable[[], int],
        apply: Callable[[int], object] | None = None,
        applied: int | None = None,
    ) -> None:
        """From now on ``held()`` (one framework's bytes on the card) counts in this process's entry,
        and ``apply(cap)`` sets that framework's cap when it is not ``applied`` any more: the slice
        less what the others and this process's other frameworks hold (in a daemon thread; the
        entry goes when the process exits)."""
        if os.getpid() == self.pid:
            self.holders.append(_Holder(held, apply, applied))
            self._run()

    def _run(self) -> None:
        if self._thread is not None:
            return
        import atexit

        atexit.register(self.forget)
        self._thread = threading.Thread(target=self._loop, name="gpushare-slice-ledger", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        next_read = 0.0
        while True:
            starting = self._start_lock is not None
            try:
                now = time.monotonic()
                if self._changed() or starting or now >= next_read:
                    next_read = now + INTERVAL if now >= next_read else next_read
                    self._step(starting)
            except Exception as err:  # the framework shutting down, or a broken ledger
                _debug(f"follow: {err!r}")
            time.sleep(START_TICK if starting else TICK)

    def _changed(self) -> bool:
        """Whether the folder changed since the last look (an entry or a request written, or a
        file removed); a change in the last two ticks counts again, a file's time being coarse."""
        try:
            mark = os.stat(self.path).st_mtime_ns
        except OSError:
            return False
        seen, self._seen = self._seen, mark
        return mark != seen or time.time_ns() - mark < 2 * TICK * 1e9

    def _step(self, starting: bool) -> None:
        holders = list(self.holders)
        for holder in holders:
            try:
                holder.last = max(0, int(holder.held()))
            except Exception as err:  # nothing new from a framework that cannot say
                _debug(f"held: {err!r}")
        total = sum(holder.last for holder in holders)
        found, asked = self._scan()
        own = os.path.join(self.path, f"{self.pid}.json")
        if total != self.held or asked > self.sync or not os.path.exists(own):
            self.sync = max(self.sync, asked)
            self.publish(total)
        if starting and (total > self._held_at_begin or time.monotonic() >= self._hold_until):
            self._release()
        cap = self.cap([(pid, held, what) for pid, held, what, _answered in found])
        for holder in holders:
            want = max(0, cap - (total - holder.last))
            if holder.apply is not None and want != holder.applied:
                holder.apply(want)
                holder.applied = want
