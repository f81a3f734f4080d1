"""gpushare-selftest names the layer that keeps the GPU from a container: device node, driver library."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpushare_hub.isolation.gpulayers import missing_layer
from gpushare_hub.isolation.selftest import document, render

pytestmark = pytest.mark.unit


def test_no_device_node_points_at_the_runtime_and_the_cdi_spec(tmp_path):
    note = missing_layer(str(tmp_path), lambda _: True)
    assert note.startswith(f"no card device node in {tmp_path}: the runtime gave this container no card")
    assert "gpushare-hub.io-gpu.json" in note and "legacy mode" in note
    (tmp_path / "nvidia0").write_text("")
    assert missing_layer(str(tmp_path), lambda _: True).startswith("no /dev/nvidiactl")


def test_a_card_without_the_drivers_library_is_told_apart(tmp_path):
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).write_text("")
    asked: list[str] = []
    note = missing_layer(str(tmp_path), lambda lib: asked.append(lib) or False)
    assert asked == ["libcuda.so.1"] and "the driver's library libcuda.so.1 cannot be loaded" in note
    assert missing_layer(str(tmp_path), lambda _: True) == ""


def test_the_missing_layer_is_a_note_of_the_report():
    doc = document(5120, {}, [], datetime(2026, 11, 26, tzinfo=UTC), layer="no card device node in /dev: x")
    assert doc["notes"][-1] == "no card device node in /dev: x"
    assert "note: no card device node in /dev: x" in render(doc)
