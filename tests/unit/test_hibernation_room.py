"""A hibernated kernel's copy is charged to the pod's memory: where the pod's limit has not the
room, the kernel stays awake and says why, instead of getting the server killed (issue 46,
part 2's check inside the notebook server)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpushare_hub.notebook.hibernator import Hibernator
from gpushare_hub.notebook.hostroom import MARGIN, free_memory, no_room
from gpushare_hub.notebook.sleepstate import REFUSED, Process, words

pytestmark = pytest.mark.unit
GIB = 1 << 30


def v2(root: Path, limit: str, used: int) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "memory.max").write_text(limit + "\n")
    (root / "memory.current").write_text(f"{used}\n")
    return root


def test_the_room_is_read_from_cgroup_v2_or_v1_and_no_limit_means_no_check(tmp_path):
    assert free_memory(v2(tmp_path / "a", str(8 * GIB), 3 * GIB)) == 5 * GIB
    assert free_memory(v2(tmp_path / "b", "max", 3 * GIB)) is None
    v1 = tmp_path / "c" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{6 * GIB}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{1 * GIB}\n")
    assert free_memory(tmp_path / "c") == 5 * GIB
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert free_memory(tmp_path / "c") is None
    assert free_memory(tmp_path / "nothing") is None
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "memory.max").write_text("junk")
    (tmp_path / "d" / "memory.current").write_text("1")
    assert free_memory(tmp_path / "d") is None


def test_a_copy_that_fits_passes_and_one_that_does_not_is_named_with_the_fix(tmp_path):
    root = v2(tmp_path, str(8 * GIB), 3 * GIB)  # 5 GiB free
    assert no_room(4 * GIB, root) == ""
    said = no_room(5 * GIB, root)  # 5 GiB and the margin: more than free
    assert said.startswith(
        "the pod's memory limit has 5.0 GiB free and the copy of its GPU memory needs 5.5 GiB"
    )
    assert "GPUShareSpawner.gpu_hibernation" in said
    assert MARGIN == 512 << 20


class OneKernel:
    def __init__(self) -> None:
        from datetime import UTC, datetime, timedelta

        self.k = SimpleNamespace(
            provisioner=SimpleNamespace(pid=1), execution_state="idle",
            last_activity=datetime.now(UTC) - timedelta(minutes=5),
        )  # fmt: skip

    def list_kernel_ids(self) -> list[str]:
        return ["k1"]

    def get_kernel(self, kid: str) -> Any:
        return self.k


def test_a_kernel_whose_copy_does_not_fit_the_pods_memory_stays_awake_untouched(tmp_path):
    calls: list[str] = []
    driver = SimpleNamespace(
        lock=lambda pid, t=0: calls.append("lock"), checkpoint=lambda pid: calls.append("cp")
    )
    hib = Hibernator(OneKernel(), driver, {}, cgroup=str(v2(tmp_path, str(4 * GIB), 1 * GIB)))
    hib.gpu_processes = lambda kid: [Process(1, "1", 3 * GIB, "big.ipynb")]  # type: ignore[method-assign]
    sleep = asyncio.run(hib.hibernate("k1"))
    assert sleep.state == REFUSED and calls == []  # the driver never touched it
    assert words(sleep, 0).startswith("stays awake: the pod's memory limit has 3.0 GiB free")
