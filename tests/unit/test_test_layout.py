"""Tests share helpers through tests/support/, never by importing each other: no file under tests/
imports a ``test_*`` module (``import tests.x.test_y``, ``from tests.x.test_y import ...``,
``from .test_y import ...``, ``from tests.x import test_y`` or ``from . import test_y``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def is_test_module(dotted: str) -> bool:
    return dotted.rpartition(".")[2].startswith("test_")


def package_dir(root: Path, path: Path, node: ast.ImportFrom) -> Path:
    """The folder that ``from <module> import ...`` in ``path`` names (absolute ones from ``root``)."""
    base = root
    if node.level:
        base = path.parent
        for _ in range(node.level - 1):
            base = base.parent
    return base.joinpath(*node.module.split(".")) if node.module else base


def imports_of_test_modules(root: Path, path: Path) -> list[str]:
    """Each import of a ``test_*`` module in ``path`` (a file under ``root``), as ``line: module``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if node.module and is_test_module(node.module):
                names = [module]
            else:  # `from package import test_x`: a module of that package
                folder = package_dir(root, path, node)
                names = [
                    f"{module} import {a.name}"
                    for a in node.names
                    if a.name.startswith("test_") and (folder / f"{a.name}.py").exists()
                ]
        else:
            continue
        found += [f"{node.lineno}: {name}" for name in names]
    return found


def offenders(root: Path) -> dict[str, list[str]]:
    """The files under ``root``/tests that import a ``test_*`` module, with those imports."""
    return {
        str(path.relative_to(root)): found
        for path in sorted((root / "tests").rglob("*.py"))
        if (found := imports_of_test_modules(root, path))
    }


def test_no_file_under_tests_imports_a_test_module() -> None:
    assert offenders(ROOT) == {}, "move what they share into tests/support/ (see its __init__.py)"


def test_the_check_sees_each_form_of_importing_a_test_module(tmp_path: Path) -> None:
    tier = tmp_path / "tests" / "tier"
    tier.mkdir(parents=True)
    (tier / "test_a.py").write_text("X = 1\n")
    (tier / "helpers.py").write_text("Y = 2\n")
    (tier / "test_b.py").write_text(
        "import tests.tier.test_a\n"
        "from tests.tier.test_a import X\n"
        "from .test_a import X\n"
        "from . import test_a\n"
        "from tests.tier import test_a, helpers\n"
        "from .helpers import Y\n"
        "from tests.support.timing import SLOW_SECONDS\n"
        "import os.path\n"
        "def later():\n"
        "    from tests.tier.test_a import X\n"
    )
    assert offenders(tmp_path) == {
        "tests/tier/test_b.py": [
            "1: tests.tier.test_a",
            "2: tests.tier.test_a",
            "3: .test_a",
            "4: . import test_a",
            "5: tests.tier import test_a",
            "10: tests.tier.test_a",
        ]
    }


def other_tiers_conftests(root: Path) -> dict[str, list[str]]:
    """The files that import the conftest of a tier folder other than their own (what tiers
    share lives in tests/support/, registered once)."""
    found: dict[str, list[str]] = {}
    for path in sorted((root / "tests").rglob("*.py")):
        own = path.relative_to(root / "tests").parts[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                parts = node.module.split(".")
                if len(parts) == 3 and parts[0] == "tests" and parts[2] == "conftest" and parts[1] != own:
                    found.setdefault(str(path.relative_to(root)), []).append(f"{node.lineno}: {node.module}")
    return found


def test_no_tier_imports_another_tiers_conftest() -> None:
    assert other_tiers_conftests(ROOT) == {}, "move what they share into tests/support/"


def test_the_check_finds_a_tier_reading_another_tiers_conftest(tmp_path: Path) -> None:
    (tmp_path / "tests" / "browser").mkdir(parents=True)
    (tmp_path / "tests" / "browser" / "test_x.py").write_text("from tests.hub.conftest import pod_of\n")
    (tmp_path / "tests" / "browser" / "test_y.py").write_text("from tests.browser.conftest import OUT\n")
    assert other_tiers_conftests(tmp_path) == {"tests/browser/test_x.py": ["1: tests.hub.conftest"]}
