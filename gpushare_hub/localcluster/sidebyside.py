"""`make test`'s main pytest as several sessions side by side, one group of tiers each.

Most tiers wait on processes they started (the API server, JupyterHub, Chromium, the plugin): one
session at a time leaves a core idle for most of the run. Each group here is its own pytest session
with its own cluster and hub, its output in its own log (``out/pytest-<group>.log``), printed whole
when it ends, so that the CI log reads as one session after another. The run fails when any
session fails, and says which.

Standard library only, like :mod:`timing`: the Makefile runs it with the venv's Python.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


@dataclass
class Session:
    """One pytest session of a group of tiers, running or ended."""

    name: str
    paths: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started: float = field(default_factory=time.monotonic)
    sink: IO[bytes] | None = None

    def start(self, pytest: list[str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.sink = self.log.open("wb")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([*pytest, *self.paths], stdout=self.sink, stderr=subprocess.STDOUT)

    def ended(self) -> int | None:
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is not None and self.sink is not None:
            self.sink.close()
            self.sink = None
        return rc


def parse_group(text: str) -> tuple[str, list[str]]:
    """``name=path,path`` -> (name, [paths]); a clear error for anything else."""
    name, sep, paths = text.partition("=")
    if not sep or not name or not paths or "/" in name:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=PATH[,PATH...], e.g. fuzz=tests/fuzz,tests/unit"
        )
    return name, [p for p in paths.split(",") if p]


def run(groups: list[tuple[str, list[str]]], pytest: list[str], logs: Path, out: IO[str]) -> int:
    """Start every group's session at once; print each log as its session ends; 0 when all passed."""
    sessions = [Session(name, paths, logs / f"pytest-{name}.log") for name, paths in groups]
    for s in sessions:
        s.start(pytest)
        out.write(f"pytest session {s.name!r} started ({' '.join(s.paths)}); its log: {s.log}\n")
    out.flush()
    failed: list[str] = []
    waiting = list(sessions)
    while waiting:
        time.sleep(1)
        for s in list(waiting):
            rc = s.ended()
            if rc is None:
                continue
            waiting.remove(s)
            took = time.monotonic() - s.started
            heading = f"pytest session {s.name!r} ({' '.join(s.paths)}): exit {rc} after {took:.0f} s"
            out.write(f"\n===== {heading} =====\n")
            out.write(s.log.read_text(errors="replace"))
            out.flush()
            if rc != 0:
                failed.append(f"{s.name} (exit {rc}, {s.log})")
    if failed:
        out.write(f"\npytest sessions that failed: {', '.join(failed)}\n")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gpushare_hub.localcluster.sidebyside",
        description="Run groups of test tiers as pytest sessions side by side; print each log as it ends.",
    )
    p.add_argument("groups", nargs="+", type=parse_group, help="NAME=PATH[,PATH...], one pytest session each")
    p.add_argument("--logs", type=Path, default=Path("out"), help="folder for pytest-NAME.log (default: out)")
    p.add_argument("--pytest", default=f"{sys.executable} -m pytest -p no:cacheprovider",
                   help="the pytest command line each session starts with")  # fmt: skip
    args = p.parse_args(argv)
    return run(args.groups, args.pytest.split(), args.logs, sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
