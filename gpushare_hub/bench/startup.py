"""``gpushare-bench startup``: start-up time and peak memory of every console script.

Each console script of the installed distribution (``[project.scripts]`` of pyproject.toml) is
run with ``--help`` ``--runs`` times, each in a fresh process; with ``--kubeconfig``,
``kubectl-inspect-gpushare`` is also run against that cluster (a real listing of Nodes and
Pods, what an admin waits for). Beside them, ``python -c pass`` is measured in the same run as
the baseline: the interpreter's own start-up on this machine. Runs are interleaved (one of each
command, then again), so that a busy moment of the machine falls on all of them alike.

Per command: the median wall time (fork to exit) and the median peak resident memory
(``ru_maxrss`` of that one child, read with ``wait4`` by a small launcher: see ``LAUNCHER``),
each also as a multiple of the baseline's. ``--source DIR`` runs the scripts against the
``gpushare_hub`` of another checkout (``PYTHONPATH=DIR``; e.g. a ``git worktree`` of an older
commit), to compare before and after on the same machine in the same minute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from .args import at_least_one

DISTRIBUTION = "gpushare-hub"
BASELINE = "python -c pass"
INSPECT = "kubectl-inspect-gpushare"


@dataclass(frozen=True)
class Command:
    label: str
    argv: tuple[str, ...]


@dataclass
class Figures:
    """The runs of one command: wall seconds and peak RSS in MiB, or why it failed."""

    command: Command
    wall_s: list[float] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    failed: str = ""
    floor_mib: float = 0.0

    @property
    def median_wall_s(self) -> float:
        return statistics.median(self.wall_s) if self.wall_s else float("nan")

    @property
    def median_rss_mib(self) -> float:
        return statistics.median(self.rss_mib) if self.rss_mib else float("nan")


def console_scripts() -> list[str]:
    """The names of the distribution's console scripts, sorted."""
    dist = metadata.distribution(DISTRIBUTION)
    return sorted(ep.name for ep in dist.entry_points if ep.group == "console_scripts")


def _executable(name: str) -> str:
    """The script beside this interpreter (the virtualenv's), else the one on PATH."""
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name) or name


def commands(only: list[str] | None = None, kubeconfig: str | None = None) -> list[Command]:
    """The baseline first, then each script with ``--help`` (those in ``only``, when given),
    then the CLI against ``kubeconfig``."""
    out = [Command(BASELINE, (sys.executable, "-c", "pass"))]
    for name in console_scripts():
        if not only or name in only:
            out.append(Command(f"{name} --help", (_executable(name), "--help")))
    if kubeconfig and (not only or INSPECT in only):
        out.append(Command(f"{INSPECT} --kubeconfig", (_executable(INSPECT), "--kubeconfig", kubeconfig)))
    return out


# Runs one command and prints its wall time and peak RSS. A child's ru_maxrss starts from the
# memory of the process it was forked from (Linux records the old image's high-water mark at
# exec), so the command is started from this small interpreter (-I -S: no site, no venv), not
# from the benchmark's own; what it holds at the fork is printed as the floor of the figures.
LAUNCHER = """
import os, sys, time
# this process's own high-water mark (VmHWM; ru_maxrss would carry the benchmark's, see above)
with open("/proc/self/status") as f:
    floor = next((int(line.split()[1]) for line in f if line.startswith("VmHWM:")), 0)
start = time.perf_counter()
pid = os.fork()
if pid == 0:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
wall = time.perf_counter() - start
print(wall, usage.ru_maxrss, os.waitstatus_to_exitcode(status), floor)
"""


@dataclass(frozen=True)
class Run:
    wall_s: float
    rss_mib: float
    exit_code: int
    last_error: str  # the last line the command wrote to stderr
    floor_mib: float  # the launcher's own peak at the fork: no figure reads below it


def run_once(argv: tuple[str, ...], env: dict[str, str] | None = None) -> Run:
    """One fresh process of ``argv``: its wall seconds and its own peak RSS (MiB)."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", LAUNCHER, *argv],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env=env,
        check=False,
    )
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    try:
        wall, rss, code, floor = done.stdout.split()
    except ValueError:
        return Run(0.0, 0.0, done.returncode or 1, lines[-1] if lines else "the launcher failed", 0.0)
    return Run(float(wall), int(rss) / 1024, int(code), lines[-1] if lines else "", int(floor) / 1024)


def measure(cmds: list[Command], runs: int, source: str | None = None) -> list[Figures]:
    env = None
    if source:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p),
        }
    results = [Figures(c) for c in cmds]
    for _ in range(runs):
        for fig in results:
            if fig.failed:
                continue
            one = run_once(fig.command.argv, env)
            if one.exit_code != 0:
                fig.failed = f"exit {one.exit_code}: {one.last_error}"
                continue
            fig.wall_s.append(one.wall_s)
            fig.rss_mib.append(one.rss_mib)
            fig.floor_mib = max(fig.floor_mib, one.floor_mib)
    return results


def to_json(results: list[Figures], runs: int, source: str | None = None) -> dict[str, Any]:
    base = results[0]
    return {
        "runs": runs,
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "source": source or "",
        "rss_floor_mib": round(max(r.floor_mib for r in results), 1),
        "commands": [
            {
                "command": r.command.label,
                "argv": list(r.command.argv),
                "median_wall_s": round(r.median_wall_s, 4),
                "median_peak_rss_mib": round(r.median_rss_mib, 1),
                "wall_x_baseline": round(r.median_wall_s / base.median_wall_s, 2),
                "rss_x_baseline": round(r.median_rss_mib / base.median_rss_mib, 2),
                "failed": r.failed,
            }
            for r in results
        ],
    }


def table(data: dict[str, Any]) -> str:
    """The figures as aligned columns, one command a line, the baseline first."""
    header = ("COMMAND", "WALL s", "x BASE", "PEAK RSS MiB", "x BASE")
    rows = [header]
    failures = []
    for c in data["commands"]:
        if c["failed"]:
            rows.append((c["command"], "failed", "", "", ""))
            failures.append(f"{c['command']}: {c['failed']}")
            continue
        rows.append(
            (
                c["command"],
                f"{c['median_wall_s']:.3f}",
                f"{c['wall_x_baseline']:.1f}",
                f"{c['median_peak_rss_mib']:.1f}",
                f"{c['rss_x_baseline']:.1f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    source = f", source {data['source']}" if data["source"] else ""
    lines = [
        f"start-up of each console script: median of {data['runs']} runs in fresh processes "
        f"(Python {data['python']}, {data['cpus']} CPUs{source}; "
        f"peak RSS reads at least the launcher's {data['rss_floor_mib']} MiB)"
    ]
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [v.rjust(w) for v, w in zip(r[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    lines += [f"failed: {f}" for f in failures]
    return "\n".join(lines) + "\n"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("startup", help="start-up time and peak memory of every console script")
    p.add_argument("--runs", type=at_least_one, default=7, help="fresh processes per command (median)")
    p.add_argument(
        "--kubeconfig", help=f"also run {INSPECT} against this cluster (a real listing of Nodes and Pods)"
    )
    p.add_argument(
        "--only", action="append", metavar="SCRIPT", help="measure only this script (repeat for more)"
    )
    p.add_argument(
        "--source", metavar="DIR", help="run the scripts against the gpushare_hub package in DIR (PYTHONPATH)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run, parser=p)


def run(args: argparse.Namespace) -> int:
    known = console_scripts()
    unknown = sorted(set(args.only or ()) - set(known))
    if unknown:
        args.parser.error(f"--only {unknown[0]}: not a console script of {DISTRIBUTION} ({', '.join(known)})")
    if args.kubeconfig and not Path(args.kubeconfig).expanduser().is_file():
        args.parser.error(f"--kubeconfig {args.kubeconfig}: no such file")
    if args.source and not (Path(args.source) / "gpushare_hub" / "__init__.py").is_file():
        args.parser.error(f"--source {args.source}: no gpushare_hub package in it")
    results = measure(commands(args.only, args.kubeconfig), args.runs, args.source)
    data = to_json(results, args.runs, args.source)
    print(json.dumps(data) if args.json else table(data), end="\n" if args.json else "")
    return 1 if any(r.failed for r in results) else 0
