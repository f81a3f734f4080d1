"""docs/sizing-a-course.md: the planner's figures for a course's week, as its commands print them
on the week examples/course-history.py writes. Asserts figures, never times."""

from __future__ import annotations

import json
import subprocess
import sys

from gpushare_hub.replay.cli import main
from tests.doccommands import BENCH, ROOT, doc_block

PAGE = ROOT / "docs" / "sizing-a-course.md"
LABELS = {"3, 5, 7 GiB": [3, 5, 7], "5 GiB only": [5], "whole cards": [15]}


def page_rows() -> dict[tuple[tuple[int, ...], int], list[str]]:
    """(catalogue, cards) -> [waiting, p95, peak] as the page's table shows them."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] in LABELS:
            rows[(tuple(LABELS[cells[0]]), int(cells[1]))] = cells[2:]
    return rows


def test_the_course_figures_in_the_docs_are_what_the_planner_prints(capsys):
    history = ROOT / "out" / "course-history.csv"
    subprocess.run([sys.executable, str(ROOT / "examples" / "course-history.py"), str(history)], check=True)
    printed = {}
    for argv in doc_block("course-sizing", BENCH).commands():
        assert argv[0] == "gpushare-replay" and "--json" in argv
        assert main([a.replace("out/course-history.csv", str(history)) for a in argv[1:]]) == 0
        out = json.loads(capsys.readouterr().out)
        for r in out["rows"]:
            p95 = "–" if r["wait_p95_seconds"] is None else f"{round(r['wait_p95_seconds'] / 60)} min"
            printed[(tuple(r["catalogue"]), r["cards"])] = [f"{r['waited_pct']}%", p95, str(r["peak_cards"])]
    with capsys.disabled():
        print("\n" + json.dumps({f"{k[0]} x{k[1]}": v for k, v in printed.items()}))
    shown = page_rows()
    assert shown, "the page's table was not found"
    wrong = {k: (v, printed.get(k)) for k, v in shown.items() if printed.get(k) != v}
    assert not wrong, f"the page shows, the planner prints: {wrong}"


def test_the_hibernation_what_if_in_the_docs_is_what_the_planner_prints(capsys):
    history = ROOT / "out" / "course-history.csv"
    subprocess.run([sys.executable, str(ROOT / "examples" / "course-history.py"), str(history)], check=True)
    block = doc_block("course-hibernation", BENCH)
    (argv,) = block.commands()
    assert argv[0] == "gpushare-replay" and "--hibernate-after" in argv
    assert main([a.replace("out/course-history.csv", str(history)) for a in argv[1:]]) == 0
    printed = capsys.readouterr().out.replace(str(history), "out/course-history.csv").splitlines()
    lines = PAGE.read_text().splitlines()[block.line :]
    start = lines.index("```text", lines.index("```")) + 1  # the output shown after the command
    shown = lines[start : lines.index("```", start)]

    def figures(text: list[str]) -> list[str]:
        return [line for line in text if not line.startswith("  took ")]

    assert figures(shown) == figures(printed)
