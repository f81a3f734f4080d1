"""Where `make test`'s time goes: each build step and each test tier, with its wall time.

Each step of `make test` appends one line to the file named by $GPUSHARE_TIMING (the Makefile sets
it; nothing is written when it is unset): the builders here record what they built or found cached
(:func:`record`, :func:`timed`), the Makefile wraps its own steps (``step``), the pytest plugin in
``tests/support/timing.py`` records each tier's time. ``table`` prints them all, last thing in the
run (also when a step failed).

A line is tab-separated: kind (build, check, tier, session, slow), name, state (cold: built now;
cached: found built; ran: neither applies; for a tier or session: its test count), its start (Unix
seconds), its wall seconds and a note.

Standard library only: the Makefile runs this file with the system Python before the venv exists
(``python3 gpushare_hub/localcluster/timing.py step venv -- ...``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

TIMING_ENV = "GPUSHARE_TIMING"
KINDS = ("build", "check", "session", "tier", "slow")


@dataclass
class Line:
    """One step's line of the timing file (see the module's docstring for its fields)."""

    kind: str
    name: str
    state: str
    start: float
    seconds: float
    note: str = ""

    def text(self) -> str:
        fields = (self.kind, self.name, self.state, f"{self.start:.1f}", f"{self.seconds:.1f}", self.note)
        return "\t".join(f.replace("\t", " ").replace("\n", " ") for f in fields) + "\n"

    @classmethod
    def parse(cls, text: str) -> Line | None:
        parts = text.rstrip("\n").split("\t")
        if len(parts) != 6 or parts[0] not in KINDS:
            return None
        try:
            return cls(parts[0], parts[1], parts[2], float(parts[3]), float(parts[4]), parts[5])
        except ValueError:
            return None


def record(kind: str, name: str, state: str, start: float, seconds: float, note: str = "") -> None:
    """Append one line to $GPUSHARE_TIMING; nothing when it is unset. ``start`` is Unix time."""
    path = os.environ.get(TIMING_ENV)
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:  # one short write per line: concurrent steps do not interleave
        f.write(Line(kind, name, state, start, seconds, note).text())


class Step:
    """A build step being timed: ``cold`` once it found something to build."""

    def __init__(self) -> None:
        self.cold = False
        self.note = ""


@contextmanager
def timed(name: str, kind: str = "build") -> Iterator[Step]:
    """Time the block as one step (recorded also when it raises); set ``.cold`` if it built."""
    step = Step()
    start, began = time.time(), time.monotonic()
    try:
        yield step
    finally:
        state = "cold" if step.cold else "cached"
        record(kind, name, state, start, time.monotonic() - began, step.note)


def read(path: Path) -> list[Line]:
    if not path.exists():
        return []
    return [line for text in path.read_text().splitlines() if (line := Line.parse(text))]


def merged(lines: list[Line]) -> list[Line]:
    """One line per build step however often it was asked for (each tier asks for the cluster's
    binaries; all but the first find them cached): cold if any built, seconds summed."""
    out: dict[tuple[str, str], Line] = {}
    for x in lines:
        key = (x.kind, x.name) if x.kind in ("build", "check") else (x.kind, f"{len(out)}")
        if key not in out:
            out[key] = Line(x.kind, x.name, x.state, x.start, x.seconds, x.note)
            continue
        seen = out[key]
        seen.seconds += x.seconds
        seen.state = "cold" if "cold" in (seen.state, x.state) else seen.state
        seen.note = seen.note or x.note
    return list(out.values())


def _row(name: str, state: str, seconds: float, note: str = "", at: str = "") -> str:
    return f"  {name[:46]:<46} {state:>7} {at:>7} {seconds:>9.1f}  {note[:60]}".rstrip()


def _overlapping(lines: list[Line]) -> float:
    """The wall time the lines cover together (steps that ran side by side count once)."""
    spans = sorted((x.start, x.start + x.seconds) for x in lines)
    total, end = 0.0, float("-inf")
    for a, b in spans:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def table(lines: list[Line], slow_shown: int = 15) -> str:
    """The table `make test` ends with."""
    if not lines:
        return "(no timing recorded)"
    out = ["", "== make test: where the time went (wall seconds; from: its start, after the run's) =="]
    steps = [x for x in lines if x.kind != "slow"]
    began = min((x.start for x in steps), default=0.0)
    for kind, title, head in (
        ("build", "builds (cold: built now; cached: found built)", "state"),
        ("check", "checks", "state"),
        ("session", "pytest sessions (wall, collection included)", "tests"),
        ("tier", "tiers (their tests' setup, call and teardown)", "tests"),
    ):
        rows = [x for x in merged(lines) if x.kind == kind]
        if not rows:
            continue
        out.append(f"{title:<48} {head:>7} {'from':>7} {'seconds':>9}")
        out += [_row(x.name, x.state, x.seconds, x.note, f"+{x.start - began:.0f}") for x in rows]
        out.append(_row("(sum)", "", sum(x.seconds for x in rows)))
    wall = max(x.start + x.seconds for x in steps) - min(x.start for x in steps)
    out.append(f"make test: {wall:.0f} s from its first step's start to its last step's end")
    out.append(
        f"  ({_overlapping(steps):.0f} s covered by the steps above; what ran side by side counts once)"
    )
    slow = sorted((x for x in lines if x.kind == "slow"), key=lambda x: -x.seconds)[:slow_shown]
    if slow:
        out.append("slowest tests (slow because of what they prove: the line after each says what):")
        for x in slow:
            out.append(f"  {x.seconds:>7.1f}  {x.name}")
            if x.note:
                out.append(f"           {x.note[:110]}")
    return "\n".join(out)


def _step(args: argparse.Namespace, cmd: list[str]) -> int:
    """Run the command after ``--`` as one step; cached when ``--cached-if`` succeeds first."""
    state = "ran"
    if args.cached_if:
        found = subprocess.run(args.cached_if, shell=True, capture_output=True).returncode == 0
        state = "cached" if found else "cold"
    start, began = time.time(), time.monotonic()
    rc = subprocess.run(cmd).returncode
    note = args.note + ("" if rc == 0 else f" (failed: exit {rc})")
    record(args.kind, args.name, state, start, time.monotonic() - began, note.strip())
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="timing", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("step", help="run the command after -- as one timed step")
    s.add_argument("name")
    s.add_argument("--kind", default="build", choices=KINDS)
    s.add_argument("--cached-if", help="a shell test run first: success means the step finds it built")
    s.add_argument("--note", default="")
    t = sub.add_parser("table", help="print the table of a timing file")
    t.add_argument("file", type=Path)
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args, cmd = p.parse_args(argv[:cut]), argv[cut + 1 :]
    if args.cmd == "step":
        if not cmd:
            p.error("step: the command goes after --")
        return _step(args, cmd)
    print(table(read(args.file)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
