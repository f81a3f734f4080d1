"""The harness's Component: stopping one leaves nothing of it behind, not even a child that moved
to a session of its own (as JupyterHub starts each managed service)."""

from __future__ import annotations

import os
import sys
import time

from gpushare_hub.localcluster.processes import Component, descendants

# A parent that starts a child in a session of its own, prints its PID, then sleeps; the child
# ignores SIGTERM, like a service its hub was killed before it could stop.
PARENT = """
import os, subprocess, sys, time
code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
print(child.pid, flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_stopping_a_component_stops_its_children_in_other_sessions(tmp_path):
    log = tmp_path / "parent.log"
    comp = Component("parent", [sys.executable, "-c", PARENT], log).start()
    deadline = time.monotonic() + 30
    lines: list[str] = []
    while not lines and time.monotonic() < deadline:
        lines = [line for line in log.read_text().splitlines() if line.strip().isdigit()]
        time.sleep(0.1)
    child = int(lines[0])
    assert comp.proc is not None and child in descendants(comp.proc.pid)
    assert os.getsid(child) != os.getsid(comp.proc.pid)  # out of the component's group
    comp.stop(grace=2)
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)


def test_descendants_reads_the_process_tree(tmp_path):
    assert descendants(os.getpid(), proc=str(tmp_path)) == []  # no /proc: nothing known
    assert os.getpid() in descendants(os.getppid())
