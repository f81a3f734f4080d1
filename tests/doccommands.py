"""The shell blocks of the docs (every page under docs/, README.md and CONTRIBUTING.md), read as commands,
so that tests run what the docs say.

A block a test tier runs is marked on the line before its fence (``chart-tier``, ``bench-tier``
or ``node-tier``)::

    <!-- chart-tier: install -->
    ```sh
    helm install gpushare-hub helm/gpushare-hub --namespace gpushare-hub --create-namespace
    ```

A shell block that cannot run here says why instead (``<!-- not-run: needs an OpenShift
cluster -->``); tests may still read its commands. Every ```sh block carries one of the two
marks, so no command in the docs is left unchecked by accident. Commands are split as a POSIX
shell would (backslash-newline continues a line, ``#`` starts a comment); pipes, redirections
and variables are not allowed in a run block, so what runs is exactly what is written.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
CHART = "chart-tier"
BENCH = "bench-tier"
NODE = "node-tier"
NOT_RUN = "not-run"
TIERS = (CHART, BENCH, NODE)
_MARK = re.compile(r"^<!--\s*(chart-tier|bench-tier|node-tier|not-run):\s*(.*?)\s*-->\s*$")
_FENCE = re.compile(r"^```(\S*)\s*$")
# Placeholders an admin fills in; the chart tier substitutes its own values for them.
PLACEHOLDER = re.compile(r"<[a-z][a-z0-9-]*>")
_SHELL_ONLY = re.compile(r"[|;&<>$`]")


class DocError(AssertionError):
    pass


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    mark: str  # a tier (CHART, BENCH) or NOT_RUN
    name: str  # the block's name (a tier) or the reason it is not run (NOT_RUN)
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[list[str]]:
        """Each command as argv, placeholders left as written."""
        joined = re.sub(r"\\\n", " ", self.text)
        out = []
        for raw in joined.splitlines():
            argv = shlex.split(raw, comments=True)
            if argv:
                out.append(argv)
        return out


def blocks(doc: Path) -> list[Block]:
    """Every ```sh block of one Markdown file, with its mark (a block without one is an error)."""
    lines = doc.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        if fence[1] == "sh":
            mark = _MARK.match(lines[start - 1]) if start else None
            if not mark:
                raise DocError(
                    f"{doc.relative_to(ROOT)}:{start + 1}: a ```sh block needs `<!-- chart-tier: NAME -->`, "
                    "`<!-- bench-tier: NAME -->` or `<!-- node-tier: NAME -->` (that tier runs it) or "
                    "`<!-- not-run: why -->` on the line before it"
                )
            found.append(Block(doc, start + 1, mark[1], mark[2], "\n".join(lines[start + 1 : i])))
        i += 1
    return found


def pages(docs: Path = DOCS) -> list[Path]:
    """The pages whose shell blocks follow these rules: every Markdown page under ``docs`` (the
    admin guides, docs/reference/, docs/measurements/), and README.md and CONTRIBUTING.md beside
    that folder."""
    found = sorted(docs.rglob("*.md"))
    for page in ("README.md", "CONTRIBUTING.md"):
        if (docs.parent / page).exists():
            found.append(docs.parent / page)
    return found


def all_blocks(docs: Path = DOCS) -> list[Block]:
    return [b for doc in pages(docs) for b in blocks(doc)]


def run_blocks(tier: str = CHART, docs: Path = DOCS) -> dict[str, Block]:
    """The blocks ``tier`` runs, by name; a name used twice is an error."""
    out: dict[str, Block] = {}
    for b in all_blocks(docs):
        if b.mark != tier:
            continue
        if b.name in out:
            raise DocError(f"{b.where}: {tier} block {b.name!r} is also at {out[b.name].where}")
        for argv in b.commands():
            bad = [a for a in argv if _SHELL_ONLY.search(PLACEHOLDER.sub("", a))]
            if bad:
                raise DocError(f"{b.where}: {shlex.join(argv)}: shell syntax ({bad[0]!r}) in a run block")
        out[b.name] = b
    return out


def doc_block(name: str, tier: str = CHART) -> Block:
    """The docs' block ``name`` that ``tier`` runs (tests call this with literal arguments, which
    tests/unit/test_docs.py reads to check that every run block is run)."""
    found = run_blocks(tier)
    if name not in found:
        raise DocError(f"no `<!-- {tier}: {name} -->` block in docs/**/*.md, README.md or CONTRIBUTING.md")
    return found[name]


def substitute(argv: list[str], values: dict[str, str]) -> list[str]:
    """Fill in the placeholders (``<gpu-node-1>``); one left unfilled is an error."""
    out = []
    for arg in argv:
        filled = PLACEHOLDER.sub(lambda m: values.get(m[0], m[0]), arg)
        left = PLACEHOLDER.findall(filled)
        if left:
            raise DocError(f"{shlex.join(argv)}: no value for {left[0]}")
        out.append(filled)
    return out


def option(argv: list[str], *names: str) -> list[str]:
    """Every value of an option (``--set x=1`` or ``--set=x=1``), in order."""
    values = []
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                values.append(argv[i + 1])
            elif arg.startswith(name + "="):
                values.append(arg[len(name) + 1 :])
    return values
