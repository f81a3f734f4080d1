"""make test's main pytest as sessions side by side (gpushare_hub/localcluster/sidebyside.py)."""

from __future__ import annotations

import argparse
import io
import re
import sys
from pathlib import Path

import pytest

from gpushare_hub.localcluster import sidebyside

ROOT = Path(__file__).resolve().parents[2]


def test_every_session_runs_at_once_and_each_log_is_printed_whole_when_it_ends(tmp_path: Path) -> None:
    # Each "pytest" is a Python one-liner that waits for the other to have started: they only
    # both finish when they ran side by side.
    script = tmp_path / "fake_pytest.py"
    script.write_text(
        "import sys, time, pathlib\n"
        "me, other = sys.argv[1], sys.argv[2]\n"
        "pathlib.Path(me).touch()\n"
        "for _ in range(200):\n"
        "    if pathlib.Path(other).exists(): break\n"
        "    time.sleep(0.05)\n"
        "else: sys.exit(3)\n"
        "print('line one of', me); print('line two of', me)\n"
        "sys.exit(1 if me.endswith('b') else 0)\n"
    )
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    out = io.StringIO()
    rc = sidebyside.run([("first", [a, b]), ("second", [b, a])], [sys.executable, str(script)], tmp_path, out)
    text = out.getvalue()
    assert rc == 1
    assert f"line one of {a}\nline two of {a}" in text and f"line one of {b}\nline two of {b}" in text
    assert re.search(r"session 'first' \(.*\): exit 0", text) and re.search(
        r"session 'second' .*: exit 1", text
    )
    assert text.rstrip().endswith(
        f"pytest sessions that failed: second (exit 1, {tmp_path / 'pytest-second.log'})"
    )
    assert (tmp_path / "pytest-first.log").read_text() == f"line one of {a}\nline two of {a}\n"


@pytest.mark.parametrize("bad", ["tests/unit", "=tests/unit", "name=", "a/b=tests"])
def test_a_group_that_is_not_name_equals_paths_is_refused_with_the_expected_form(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected NAME=PATH\[,PATH\.\.\.\]"):
        sidebyside.parse_group(bad)


def test_the_makefiles_groups_hold_every_tier_but_node_once() -> None:
    """A tier folder added to tests/ and left out of MAIN_GROUPS would never run in make test."""
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("MAIN_GROUPS :="))
    paths = [p for group in line.split(":=")[1].split() for p in sidebyside.parse_group(group)[1]]
    tiers = sorted(
        f"tests/{d.name}" for d in (ROOT / "tests").iterdir() if d.is_dir() and any(d.glob("test_*.py"))
    )
    assert sorted(paths) == [t for t in tiers if t != "tests/node"], (paths, tiers)
