"""gpushare-hub's container ledger: one GPU slice for every Python process of a notebook server.

Part of the start-up hook: ``_gpushare_hub_caps.py`` beside it loads this file when a framework starts
using the GPU. A notebook server runs many GPU processes (a kernel per open notebook, a Python in a
terminal, a restarted kernel whose old process still holds memory); a per-process cap would let
each of them take the whole slice. So each process that holds GPU memory (PyTorch, CuPy or JAX)
keeps one small file in the container's ledger folder (``$GPUSHARE_LEDGER_DIR``, else
``/tmp/gpushare-hub-ledger``: a container has its own ``/tmp``; ``/dev/shm`` is the pod's, and on MPS
nodes the card's) saying what it holds, and its cap is the slice less what the others hold. A
process that ended frees its share: its file names its pid and the kernel's start time of that
pid, and a file whose process is gone (or whose pid another process now has) is ignored and
removed. A hibernated process counts as holding nothing (``_gpushare_hub_hibernation.py``).

Each entry also carries ``sync``, the newest request to publish that its process answered:
``_gpushare_hub_ledgersync.py`` beside this file keeps the entries current (a start lock, requests
to publish now, a follow loop), which closes the race of two processes started back to back.

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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping  # noqa: UP035 - Python 3.8

    Entry = tuple[int, int, str]  # (pid, bytes held, what the process is)
    Seen = tuple[int, int, str, int]  # ... and the newest request it answered (-1: it answers none)

LEDGER_VAR = "GPUSHARE_LEDGER_DIR"
DEFAULT_DIR = "/tmp/gpushare-hub-ledger"
SYNC = ".sync"  # ``<pid>.sync``: that process starts and asks the others to publish now
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


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _doc(path: str, pid: int) -> dict[str, Any] | None:
    """The JSON object of one ledger file of process ``pid`` (never through a link), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        doc = json.loads(raw.decode("utf-8")) if len(raw) <= MAX_BYTES else None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    ok = isinstance(doc, dict) and doc.get("pid") == pid and isinstance(doc.get("start"), str)
    return doc if ok else None


def scan(path: str, own: int, proc: str = "/proc") -> tuple[list[Seen], int]:
    """The entries of the other live processes in ``path``, each with the newest request it
    answered, and the newest request of another live process (0: none); a stale file is removed."""
    try:
        names = [n for n in os.listdir(path) if n.endswith((".json", SYNC))]
    except OSError:
        return [], 0
    found, asked = [], 0
    for name in names[:MAX_ENTRIES]:
        stem, _dot, kind = name.partition(".")
        # ASCII digits only (``"²".isdigit()`` is true), bounded: a pid has at most 7 digits.
        if not (0 < len(stem) <= 10 and stem.isascii() and stem.isdigit()) or int(stem) in (own, 0):
            continue
        pid = int(stem)
        doc = _doc(os.path.join(path, name), pid)
        if doc is None:
            continue
        started, token = doc["start"], _count(doc.get("sync"))
        if start_time(pid, proc) != started:  # the process ended: its share comes back
            for stale in (name, f"{pid}{HIBERNATED}") if kind == "json" else (name,):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(path, stale))
            continue
        if kind != "json":
            asked = max(asked, token or 0)
            continue
        held, what = _count(doc.get("held")), doc.get("what")
        if held is None or not isinstance(what, str):
            continue
        answered = -1 if token is None else token
        if hibernation.hibernated_since(path, pid, started) is not None:  # its memory is in host memory
            held, what, answered = 0, f"{what[:MAX_WHAT]} (hibernated)", -1
        found.append((pid, held, what[:MAX_WHAT], answered))
    return found, asked


def read_others(path: str, own: int, proc: str = "/proc") -> list[Entry]:
    """The entries of the other live processes in ``path`` (a stale one's file is removed)."""
    return [(pid, held, what) for pid, held, what, _answered in scan(path, own, proc)[0]]


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
        self.sync = 0  # the newest request to publish that this process answered
        # publish and forget under one lock: the daemon thread must not write the entry again
        # after the process's exit took it away.
        self._lock = threading.Lock()
        self._closed = False

    def others(self) -> list[Entry]:
        return [(pid, held, what) for pid, held, what, _answered in self._scan()[0]]

    def _scan(self) -> tuple[list[Seen], int]:
        try:
            return scan(self.path, self.pid, self.proc)
        except Exception as err:
            _debug(f"could not read {self.path}: {err!r}")
            return [], 0

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
                self.held = max(0, int(held))
                doc = {"pid": self.pid, "start": self.start, "held": self.held, "what": self.what}
                self._put(f"{self.pid}.json", {**doc, "sync": self.sync})

    def _folder(self) -> None:
        if not os.path.isdir(self.path):
            os.makedirs(self.path, exist_ok=True)
            os.chmod(self.path, 0o1777)  # every user of the container, as /tmp

    def _put(self, name: str, doc: dict[str, Any]) -> bool:
        """Write ``doc`` as the file ``name`` of the folder, atomically; whether it was written."""
        try:
            self._folder()
            tmp = os.path.join(self.path, _tmp_name(self.pid))
            # The folder is every user's (1777): a name made here alone, never a planted link.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), ENTRY_MODE)
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(json.dumps(doc))
                os.replace(tmp, os.path.join(self.path, name))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            return True
        except Exception as err:
            _debug(f"could not write to {self.path}: {err!r}")
            return False

    def forget(self) -> None:
        """Take the entry away (at exit); nothing writes it again."""
        if os.getpid() != self.pid:
            return
        with self._lock:
            self._closed = True
            for name in (f"{self.pid}.json", f"{self.pid}{SYNC}"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.path, name))
