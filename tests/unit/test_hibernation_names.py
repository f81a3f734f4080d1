"""``gpushare/api/hibernation`` names each kernel by the notebook its session runs (Jupyter
Server's session manager), as the status bar's Kernels section shows it. Pure: fakes of the kernel
and session managers, no process."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from gpushare_hub.isolation.simcheckpoint import SimulatedCheckpoint
from gpushare_hub.notebook.hibernator import Hibernator
from gpushare_hub.notebook.sleepstate import HIBERNATED
from gpushare_hub.notebook.wakeonrun import document, notebook_paths


class Kernels:
    """Jupyter Server's kernel manager, as the hibernation route reads it."""

    def __init__(self, *ids: str) -> None:
        self.kernels = {kid: SimpleNamespace(execution_state="idle") for kid in ids}

    def list_kernel_ids(self) -> list[str]:
        return list(self.kernels)

    def get_kernel(self, kid: str) -> Any:
        return self.kernels[kid]


class Sessions:
    """Jupyter Server's session manager: ``list_sessions`` answers ``listed`` (or raises it)."""

    def __init__(self, listed: object) -> None:
        self.listed = listed

    async def list_sessions(self) -> object:
        if isinstance(self.listed, Exception):
            raise self.listed
        return self.listed


def test_each_kernel_is_named_by_its_sessions_notebook_and_one_without_a_session_by_nothing():
    listed = [
        {"id": "s1", "path": "work/big.ipynb", "name": "big.ipynb", "kernel": {"id": "k1"}},
        {"id": "s2", "path": "", "name": "console-1", "kernel": {"id": "k2"}},
        {"id": "s3", "path": "no-kernel.ipynb", "kernel": None},
        "odd",
    ]
    names = asyncio.run(notebook_paths(Sessions(listed)))
    assert names == {"k1": "work/big.ipynb", "k2": "console-1"}

    hib = Hibernator(Kernels("k1", "k3"), SimulatedCheckpoint("/nonexistent"), {})
    hib.sleep_of("k1").state, hib.sleep_of("k1").since = HIBERNATED, time.time() - 120
    doc = document(hib, 600, names)
    assert [(k["id"], k["name"], k["state"]) for k in doc["kernels"]] == [
        ("k1", "work/big.ipynb", "hibernated"),
        ("k3", "", "awake"),
    ]
    assert doc["summary"] == "1 kernel hibernated" and doc["hibernate_after"] == 600


def test_without_a_session_manager_or_when_it_fails_the_kernels_have_no_names():
    assert asyncio.run(notebook_paths(None)) == {}
    assert asyncio.run(notebook_paths(Sessions(RuntimeError("database is locked")))) == {}
    assert asyncio.run(notebook_paths(Sessions({"not": "a list"}))) == {}


def test_a_server_without_hibernation_answers_the_same_keys():
    doc = document(None, None)
    assert doc["available"] is False and doc["why_not"] == "this server has no GPU slice"
    assert doc["summary"] == "" and doc["kernels"] == []
