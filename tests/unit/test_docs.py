"""docs/*.md stay runnable and linked: every shell block is marked, every run block is run by its
tier with commands its stand-ins know, and every relative link reaches a file and heading.

No cluster here: which blocks a tier runs is read from its test files (the literal names they
pass to ``doc_block``), and each command is checked against what the chart tier's runner does.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.chart.docrun import PROGRAMS
from tests.doccommands import BENCH, CHART, DOCS, PLACEHOLDER, ROOT, all_blocks, run_blocks

PAGES = sorted(DOCS.glob("*.md"))
LINKED_FROM = [*PAGES, ROOT / "README.md", ROOT / "helm" / "gpushare-hub" / "README.md"]
TIER_TESTS = {CHART: ROOT / "tests" / "chart", BENCH: ROOT / "tests" / "bench"}
# Placeholders the chart tier fills in (docs/README.md, "How these pages are tested").
KNOWN_PLACEHOLDERS = {"<gpu-node-1>", "<gpu-node-2>", "<registry>", "<kubernetes-version>"}


# Functions that take a docs block's name first (and, for doc_block, its tier second).
RUNNERS = {"doc_block", "run_doc"}


def names_run_by(folder: Path, tier: str) -> set[str]:
    """Literal block names that the tier's tests pass to doc_block or run_doc (for ``tier``)."""
    constants = {"CHART": CHART, "BENCH": BENCH}
    found = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if called not in RUNNERS or not node.args or not isinstance(node.args[0], ast.Constant):
                continue
            block_tier = CHART
            if len(node.args) > 1:
                second = node.args[1]
                block_tier = (
                    second.value
                    if isinstance(second, ast.Constant)
                    else constants.get(getattr(second, "id", ""), "")
                )
            if block_tier == tier:
                found.add(node.args[0].value)
    return found


def test_there_is_a_page_for_each_topic_of_the_issue():
    assert {p.name for p in PAGES} >= {
        "README.md",
        "install.md",
        "zero-to-jupyterhub.md",
        "openshift.md",
        "migrating-from-aliyun.md",
        "slice-sizes.md",
        "why-a-spawn-waits.md",
        "isolation.md",
        "uninstall.md",
    }


def test_every_shell_block_is_marked():
    assert all_blocks()  # raises, naming the file and line, for a block without a mark


@pytest.mark.parametrize("tier", [CHART, BENCH])
def test_every_run_block_is_run_by_its_tier_and_every_name_the_tier_runs_exists(tier):
    marked = set(run_blocks(tier))
    run = names_run_by(TIER_TESTS[tier], tier)
    assert (sorted(marked - run), sorted(run - marked)) == ([], [])


def test_the_chart_tier_blocks_the_issue_asks_for_exist():
    assert set(run_blocks(CHART)) >= {
        "install",
        "z2jh",
        "openshift-template",
        "aliyun-find",
        "aliyun-remove",
        "uninstall",
    }


def test_chart_tier_commands_are_ones_its_runner_performs():
    for block in run_blocks(CHART).values():
        for argv in block.commands():
            assert argv[0] in PROGRAMS, f"{block.where}: {argv[0]} is not run by the chart tier"
            unknown = {p for a in argv for p in PLACEHOLDER.findall(a)} - KNOWN_PLACEHOLDERS
            assert not unknown, f"{block.where}: placeholders {unknown} have no documented value"


def test_bench_tier_commands_are_replays():
    from gpushare_hub.replay.cli import build_parser

    for block in run_blocks(BENCH).values():
        for argv in block.commands():
            assert argv[0] == "gpushare-replay", block.where
            build_parser().parse_args(argv[1:])  # every option exists (exits 2 otherwise)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            base = slug(m[1])
            name, n = base, 0
            while name in out:
                n += 1
                name = f"{base}-{n}"
            out.add(name)
    return out


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", LINKED_FROM, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_its_heading(page: Path):
    broken = []
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_the_readme_links_every_page_in_its_documentation_section():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Documentation") : readme.index("## What is here")]
    linked = {t.partition("#")[0] for t in LINK.findall(section)}
    assert {f"docs/{p.name}" for p in PAGES} <= linked


def write_doc(tmp_path: Path, text: str) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    (docs / "page.md").write_text(text)
    return docs


def test_a_block_is_read_as_a_shell_would_split_it(tmp_path: Path, monkeypatch):
    import tests.doccommands as dc

    monkeypatch.setattr(dc, "ROOT", tmp_path)
    docs = write_doc(
        tmp_path,
        "<!-- chart-tier: one -->\n```sh\nhelm install x \\\n    --set 'a={b,c}'  # why\n\n"
        "kubectl label node <gpu-node-1> k=v\n```\n",
    )
    (block,) = dc.run_blocks(CHART, docs).values()
    assert block.commands() == [
        ["helm", "install", "x", "--set", "a={b,c}"],
        ["kubectl", "label", "node", "<gpu-node-1>", "k=v"],
    ]
    assert dc.substitute(block.commands()[1], {"<gpu-node-1>": "gpu-1"})[3] == "gpu-1"
    with pytest.raises(dc.DocError, match="no value for <gpu-node-1>"):
        dc.substitute(block.commands()[1], {})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("```sh\nls\n```\n", "page.md:1: a ```sh block needs"),
        ("<!-- chart-tier: a -->\n```sh\nhelm list | wc -l\n```\n", "shell syntax ('|')"),
        (
            "<!-- chart-tier: a -->\n```sh\nhelm list\n```\n<!-- chart-tier: a -->\n```sh\nhelm list\n```\n",
            "also at",
        ),
    ],
    ids=["unmarked", "pipe", "twice"],
)
def test_a_block_that_cannot_be_run_as_written_is_refused_with_its_place(
    tmp_path: Path, monkeypatch, text, words
):
    import tests.doccommands as dc

    monkeypatch.setattr(dc, "ROOT", tmp_path)
    with pytest.raises(dc.DocError, match=re.escape(words)):
        dc.run_blocks(CHART, write_doc(tmp_path, text))
