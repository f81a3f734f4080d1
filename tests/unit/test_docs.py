"""The docs stay runnable and linked: every shell block of docs/ (guides, reference/, measurements/)
and CONTRIBUTING.md is marked, every run block is run by its tier with commands its stand-ins
know, and every relative link reaches a file and heading. The README stays a front door that
links every page and shows CI's test command, and every measurement page says when, at which
commit and on which machine its figures were taken.

No cluster here: which blocks a tier runs is read from its test files (the literal names they
pass to ``doc_block``), and each command is checked against what the chart tier's runner does.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.chart.docrun import PROGRAMS
from tests.doccommands import BENCH, CHART, DOCS, NODE, PLACEHOLDER, ROOT, all_blocks, pages, run_blocks

PAGES = sorted(DOCS.glob("*.md"))  # the admin guides
REFERENCE = sorted((DOCS / "reference").glob("*.md"))
MEASUREMENTS = DOCS / "measurements"
README = ROOT / "README.md"
LINKED_FROM = [
    *pages(),
    README,
    ROOT / "helm" / "README.md",
    ROOT / "helm" / "gpushare-hub" / "README.md",
    ROOT / "examples" / "README.md",
]
TIER_TESTS = {CHART: ROOT / "tests" / "chart", BENCH: ROOT / "tests" / "bench", NODE: ROOT / "tests" / "node"}
# Placeholders the chart tier fills in (docs/README.md, "How these pages are tested").
KNOWN_PLACEHOLDERS = {"<gpu-node-1>", "<gpu-node-2>", "<registry>", "<kubernetes-version>"}


# Functions that take a docs block's name first (and, for doc_block, its tier second).
RUNNERS = {"doc_block", "run_doc"}


def names_run_by(folder: Path, tier: str) -> set[str]:
    """Literal block names that the tier's tests pass to doc_block or run_doc (for ``tier``)."""
    constants = {"CHART": CHART, "BENCH": BENCH, "NODE": NODE}
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
        "security.md",
    }
    assert {p.name for p in REFERENCE} >= {
        "extender.md",
        "device-plugin.md",
        "memory-isolation.md",
        "kubectl-inspect.md",
        "hub-service.md",
        "spawner.md",
    }
    assert (ROOT / "CONTRIBUTING.md").exists() and (MEASUREMENTS / "README.md").exists()


def test_every_shell_block_is_marked():
    assert all_blocks()  # raises, naming the file and line, for a block without a mark


@pytest.mark.parametrize("tier", [CHART, BENCH, NODE])
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


def section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level or above."""
    start = text.index(heading + "\n")
    level = heading.split(" ")[0]
    below = re.compile(r"^#{1," + str(len(level)) + "} ", flags=re.M)
    ends = [m.start() for m in below.finditer(text) if m.start() > start]
    return text[start : ends[0] if ends else len(text)]


def test_the_readme_links_every_page_in_its_documentation_section():
    linked = {t.partition("#")[0] for t in LINK.findall(section(README.read_text(), "## Documentation"))}
    wanted = {str(p.relative_to(ROOT)) for p in [*PAGES, *REFERENCE, MEASUREMENTS / "README.md"]}
    assert sorted(wanted - linked) == [] and "CONTRIBUTING.md" in linked


def fenced_lines(text: str) -> set[str]:
    return {
        line.strip()
        for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
        for line in block.splitlines()
    }


def test_the_readme_shows_the_command_ci_runs_in_a_code_block():
    """.ci/run runs exactly the README's test command: its commands are lines of a README code block."""
    ci = [
        line.strip()
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line.strip() and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci == ["make test"]
    assert set(ci) <= fenced_lines(README.read_text())


def test_the_readme_is_a_short_front_door_with_both_pictures():
    text = README.read_text()
    assert len(text.splitlines()) <= 150
    for picture in ("docs/images/spawn-form.png", "docs/images/dashboard.png"):
        assert f"]({picture})" in text and (ROOT / picture).stat().st_size > 10_000, picture
    assert {"## Install on a cluster", "## Try it locally", "## Run the tests"} <= set(text.splitlines())
    assert "make demo" in fenced_lines(text)


MEASUREMENT_PAGES = sorted(p for p in MEASUREMENTS.glob("*.md") if p.name != "README.md")


@pytest.mark.parametrize("page", MEASUREMENT_PAGES, ids=lambda p: p.name)
def test_a_measurement_page_names_its_date_commit_and_machine_and_is_listed(page: Path):
    text = page.read_text()
    missing = [
        what
        for what, pattern in (
            ("a date (YYYY-MM-DD)", r"\b20\d\d-\d\d-\d\d\b"),
            ("a commit", r"\b[0-9a-f]{7,40}\b"),
            ("the machine", r"(?i)\bmachine\b"),
        )
        if not re.search(pattern, text)
    ]
    assert not missing, f"{page.relative_to(ROOT)} does not name {', '.join(missing)}"
    index = {t.partition("#")[0] for t in LINK.findall((MEASUREMENTS / "README.md").read_text())}
    assert page.name in index, f"{page.relative_to(ROOT)} is not listed in docs/measurements/README.md"


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
