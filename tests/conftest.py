"""Test tiers (DESIGN.md): each folder of tests/ is one tier and carries that tier's marker."""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "cluster", "kubelet", "hub", "browser", "chart", "bench")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        rel = Path(str(item.fspath)).relative_to(root)
        tier = rel.parts[0] if len(rel.parts) > 1 else None
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
