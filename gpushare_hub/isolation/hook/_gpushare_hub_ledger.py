"""gpushare-hub's container ledger: one GPU slice for every Python process of a notebook server.

Part of the start-up hook: ``_gpushare_hub_caps.py`` beside it loads this file when a framework starts
using the GPU. A notebook server runs many GPU processes (a kernel per open notebook, a Python in a
terminal, a restarted kernel whose old process still holds memory); a per-process cap would let
each of them take the whole slice. So each process that holds GPU memory keeps one small file in
the container's ledger folder (``$GPUSHARE_LEDGER_DIR``, else ``/tmp/gpushare-hub-ledger``: a
container has its own ``/tmp``; ``/dev/shm`` is the pod's, and on MPS nodes the card's) saying
what it holds, and its cap is the slice less what the others hold,
set again every :data:`INTERVAL` seconds while it runs. A process that ended frees its share: its
file names its pid and the kernel's start time of that pid, and a file whose process is gone (or
whose pid another process now has) is ignored and removed. A process that the notebook server
hibernated (CUDA's process checkpoint: its GPU memory moved into host memory) has a
``<pid>.hibernated`` file beside its entry and counts as holding nothing until it is woken
(``_gpushare_hub_hibernation.py``, beside this file).

This holds among processes that run the hook unchanged. The user's own code can write these files
or lift its own cap: the cooperative tier never held against that, and the device plugin's
measurement of the whole pod is what holds there (docs/isolation.md). So every file is read as
untrusted input: at most :data:`MAX_ENTRIES` files of at most :data:`MAX_BYTES` each, an entry of
the wrong shape skipped, and no exception ever leaves this module's public functions.

Standard library only, Python 3.8 or later, as the hook.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping  # noqa: UP035 - Python 3.8

    Entry = tuple[int, int, str]  # (pid, bytes held, what the process is)

LEDGER_VAR = "GPUSHARE_LEDGER_DIR"
DEFAULT_DIR = "/tmp/gpushare-hub-ledger"
# How often a running process publishes what it holds and takes its cap again, in seconds.
INTERVAL = 0.5
MAX_ENTRIES = 256
MAX_BYTES = 4096
MAX_WHAT = 80
DEBUG_VAR = "GPUSHARE_HOOK_DEBUG"
ENTRY_MODE = 0o644  # the other users' processes read it; only its owner writes it


def _debug(message: str) -> None:
    if os.environ.get(DEBUG_VAR):
        sys.stderr.write(f"gpushare-hub ledger: {message}\n")


def _beside(filename: str) -> Any:
    """The hook's module in ``filename`` beside this file, loaded once under its own name."""
    name = filename[:-3]
    module = sys.modules.get(name)
    if module is None:
        import importlib.util

        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        sys.modules[name] = module
    return module


if TYPE_CHECKING:
    from gpushare_hub.isolation.hook import _gpushare_hub_hibernation as hibernation
else:
    hibernation = _beside("_gpushare_hub_hibernation.py")
HIBERNATED = hibernation.HIBERNATED


def _tmp_name(pid: int) -> str:
    """The name of a new temporary entry: no other user of the folder can foresee it."""
    return f".{pid}.{os.urandom(8).hex()}.tmp"


def folder(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(LEDGER_VAR, "").strip() or DEFAULT_DIR


def start_time(pid: int, proc: str = "/proc") -> str | None:
    """The kernel's start time of process ``pid`` (``/proc/<pid>/stat``'s 22nd field): with the
    pid, it names one process, even after the pid is given to another. None when the process
    has ended, a zombie included (a killed kernel is one until Jupyter Server reaps it)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            stat = f.read(4096).decode("ascii", "replace")
        fields = stat[stat.rindex(")") + 2 :].split()
    except (OSError, ValueError):
        return None
    if len(fields) < 20 or fields[0] in ("Z", "X", "x"):
        return None
    return fields[19]


def describe(env: Mapping[str, str] | None = None, argv: list[str] | None = None) -> str:
    """What this process is, as a user would name it: the notebook a kernel runs (Jupyter Server
    gives kernels ``JPY_SESSION_NAME``), else the script or ``python``, with the pid."""
    env = os.environ if env is None else env
    argv = sys.argv if argv is None else argv
    session = env.get("JPY_SESSION_NAME", "").strip()
    if session:
        return session.rsplit("/", 1)[-1][:MAX_WHAT]
    first = argv[0] if argv else ""
    if first in ("", "-c", "-m") or first.endswith("ipykernel_launcher.py"):
        name = "a kernel" if env.get("JPY_PARENT_PID") else "python"
    else:
        name = first.rsplit("/", 1)[-1]
    return f"{name} (pid {os.getpid()})"[:MAX_WHAT]


def _entry(raw: bytes, pid: int) -> tuple[str, int, str] | None:
    """(start, bytes held, what) of one file's text, or None when it is not a ledger entry."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    start, held, what = doc.get("start"), doc.get("held"), doc.get("what")
    if doc.get("pid") != pid or not isinstance(start, str) or not isinstance(what, str):
        return None
    if not isinstance(held, int) or isinstance(held, bool) or held < 0:
        return None
    return start, held, what[:MAX_WHAT]


def read_others(path: str, own: int, proc: str = "/proc") -> list[Entry]:
    """The entries of the other live processes in ``path`` (a stale one's file is removed)."""
    try:
        names = [n for n in os.listdir(path) if n.endswith(".json")]
    except OSError:
        return []
    found = []
    for name in names[:MAX_ENTRIES]:
        stem = name[: -len(".json")]
        # ASCII digits only (``"²".isdigit()`` is true), bounded: a pid has at most 7 digits.
        if not (0 < len(stem) <= 10 and stem.isascii() and stem.isdigit()) or int(stem) in (own, 0):
            continue
        pid = int(stem)
        try:
            fd = os.open(os.path.join(path, name), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
            with os.fdopen(fd, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except OSError:
            continue
        entry = _entry(raw, pid) if len(raw) <= MAX_BYTES else None
        if entry is None:
            continue
        started, held, what = entry
        if start_time(pid, proc) != started:  # the process ended: its share comes back
            for stale in (name, f"{pid}{HIBERNATED}"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(path, stale))
            continue
        if hibernation.hibernated_since(path, pid, started) is not None:  # its memory is in host memory
            held, what = 0, f"{what} (hibernated)"[:MAX_WHAT]
        found.append((pid, held, what))
    return found


class Ledger:
    """This process's place in its container's ledger, for a slice of ``slice_bytes``."""

    def __init__(self, slice_bytes: int, env: Mapping[str, str] | None = None, proc: str = "/proc") -> None:
        self.slice_bytes = slice_bytes
        self.path = folder(env)
        self.proc = proc
        self.pid = os.getpid()
        self.start = start_time(self.pid, proc) or ""
        self.what = describe(env)
        self.held = 0
        self._thread: threading.Thread | None = None
        # publish and forget under one lock: the daemon thread must not write the entry again
        # after the process's exit took it away.
        self._lock = threading.Lock()
        self._closed = False

    def others(self) -> list[Entry]:
        try:
            return read_others(self.path, self.pid, self.proc)
        except Exception as err:
            _debug(f"could not read {self.path}: {err!r}")
            return []

    def cap(self, others: list[Entry] | None = None) -> int:
        """What this process may hold: the slice less what the others hold (never below 0)."""
        entries = self.others() if others is None else others
        taken = sum(min(held, self.slice_bytes) for _pid, held, _what in entries)
        return max(0, self.slice_bytes - taken)

    def publish(self, held: int) -> None:
        """Write what this process holds (atomically: a reader sees the old file or the new one)."""
        if os.getpid() != self.pid:  # a forked child: the parent's entry is not its own
            return
        with self._lock:
            if not self._closed:
                self._write(max(0, int(held)))

    def _write(self, held: int) -> None:
        self.held = held
        try:
            if not os.path.isdir(self.path):
                os.makedirs(self.path, exist_ok=True)
                os.chmod(self.path, 0o1777)  # every user of the container, as /tmp
            doc = {"pid": self.pid, "start": self.start, "held": self.held, "what": self.what}
            tmp = os.path.join(self.path, _tmp_name(self.pid))
            # The folder is every user's (1777): a name made here alone, never a planted link.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), ENTRY_MODE)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(doc))
                os.replace(tmp, os.path.join(self.path, f"{self.pid}.json"))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except Exception as err:
            _debug(f"could not write to {self.path}: {err!r}")

    def forget(self) -> None:
        """Take the entry away (at exit); nothing writes it again."""
        if os.getpid() != self.pid:
            return
        with self._lock:
            self._closed = True
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.path, f"{self.pid}.json"))

    def follow(
        self,
        held: Callable[[], int],
        apply: Callable[[int], object],
        applied: int | None = None,
        interval: float = INTERVAL,
    ) -> None:
        """From now on, every ``interval`` seconds: publish ``held()``, and ``apply(cap)`` when the
        cap is not ``applied`` any more (in a daemon thread; the entry goes when the process exits)."""
        if self._thread is not None:
            return
        import atexit

        atexit.register(self.forget)

        def loop() -> None:
            last = applied
            while True:
                try:
                    self.publish(held())
                    cap = self.cap()
                    if cap != last:
                        apply(cap)
                        last = cap
                except Exception as err:  # the framework shutting down, or a broken ledger
                    _debug(f"follow: {err!r}")
                time.sleep(interval)

        self._thread = threading.Thread(target=loop, name="gpushare-slice-ledger", daemon=True)
        self._thread.start()
