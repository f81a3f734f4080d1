"""Child processes that never outlive the harness.

Each component runs in its own process group with its output in a log file.
It is stopped with SIGTERM then SIGKILL on :meth:`Component.stop`, at interpreter
exit (``atexit``), and, because the kernel is asked to send SIGKILL when the
parent dies (``PR_SET_PDEATHSIG``), even when the harness itself is killed.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gpushare_hub.isolation.processtree import descendants as descendants
from gpushare_hub.service.address import free_port as free_port  # the harness's importers use it from here

_LIVE: set[Component] = set()


class HarnessError(RuntimeError):
    """A component did not start or become ready; the message names its log."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


class Component:
    """One long-running program of the local cluster."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
    ) -> None:
        self.name = name
        self.pass_fds = pass_fds
        self.argv = argv
        self.log = log
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0  # the port it serves on, where the harness knows it
        self.url = ""
        self.metrics_url = ""  # where a component serves /metrics and /healthz, if apart from url

    def start(self) -> Component:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        fh = self.log.open("ab")
        fh.write(f"\n==== starting: {' '.join(self.argv)}\n".encode())
        fh.flush()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
                # Each component execs at once: no gRPC fork handlers in it or its children.
                env={**(os.environ if self.env is None else self.env), "GRPC_ENABLE_FORK_SUPPORT": "false"},
                pass_fds=self.pass_fds,
            )
        except OSError as err:
            raise HarnessError(f"{self.name}: cannot start {self.argv[0]}: {err.strerror}") from err
        finally:
            fh.close()
        _LIVE.add(self)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL, as a crash would (tests use this)."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        _LIVE.discard(self)

    def stop(self, grace: float = 10.0) -> None:
        if self.proc is None:
            return
        # Children that left the group (JupyterHub starts each managed service in a session of
        # its own) would outlive a hub killed before its own clean-up: they go at the end too.
        children = descendants(self.proc.pid)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()
        # Anything the component forked into its group goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _LIVE.discard(self)

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll ``ready`` until true; fail early if the process exits, naming its log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise HarnessError(
                    f"{self.name} exited (code {code}) before {what}; log {self.log}:\n{tail(self.log)}"
                )
            try:
                if ready():
                    return
            except Exception:  # not ready yet, whatever the reason
                pass
            time.sleep(0.2)
        raise HarnessError(f"{self.name}: not {what} after {timeout:.0f}s; log {self.log}:\n{tail(self.log)}")


@atexit.register
def _stop_all() -> None:
    for comp in list(_LIVE):
        comp.stop(grace=3)
