"""The status bar's words for a server over its slice, naming the processes that hold the memory.

The hub service flags an allocation over its slice (``over_slice``, the device plugin's
measurement of the whole pod) and, with an over-slice rule, says what will happen
(``over_slice_return``). Which processes hold the memory only the container knows: the start-up
hook's container ledger (``$GPUSHARE_LEDGER_DIR``), read here, in the notebook server, as the
hook reads it (:mod:`_gpushare_hub_ledger`, beside the hook).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from typing import Any

from gpushare_hub.core.durations import duration_words
from gpushare_hub.core.names import LEDGER_DIR_ENV
from gpushare_hub.isolation.hookfiles import HOOK_DIR

LEDGER_MODULE = "_gpushare_hub_ledger"
HIBERNATION_MODULE = "_gpushare_hub_hibernation"  # the ledger's hibernation markers
MIB = 1 << 20


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def hook_module(name: str) -> Any:
    """The start-up hook's module ``name`` (loaded from the hook's folder once), or None."""
    module = sys.modules.get(name)
    if module is None:
        try:
            spec = importlib.util.spec_from_file_location(name, HOOK_DIR / f"{name}.py")
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception:
            return None
        sys.modules[name] = module
    return module


def ledger_module() -> Any:
    """The start-up hook's ledger module (what it reads and writes), or None."""
    return hook_module(LEDGER_MODULE)


def hibernation_module() -> Any:
    """The start-up hook's hibernation markers (``mark_hibernated``, ``unmark_hibernated``), or None."""
    return hook_module(HIBERNATION_MODULE)


def server_processes(env: Mapping[str, str]) -> list[tuple[int, int, str]]:
    """The container's GPU processes as its ledger has them: (pid, bytes held, what), largest
    first; empty without a ledger, or when it cannot be read."""
    folder = env.get(LEDGER_DIR_ENV, "").strip()
    module = ledger_module()
    if not folder or module is None:
        return []
    try:
        found: list[tuple[int, int, str]] = module.read_others(folder, 0)
    except Exception:  # the ledger is the user's to break: the status bar still answers
        return []
    return sorted(found, key=lambda e: -e[1])


def over_warning(allocation: Mapping[str, Any] | None) -> str:
    """``GPU over slice: stopped in 4 min`` (or only ``GPU over slice``) while the pod is over."""
    alloc = _mapping(allocation)
    if alloc.get("over_slice") is not True:
        return ""
    ret = _mapping(alloc.get("over_slice_return"))
    if ret.get("action") != "stop" or ret.get("phase") not in ("warn", "due"):
        return "GPU over slice"
    left = ret.get("seconds_left")
    if ret.get("phase") == "due" or not isinstance(left, int) or left <= 0:
        return "GPU over slice: being stopped"
    return f"GPU over slice: stopped in {duration_words(left)}"


def over_problem(allocation: Mapping[str, Any] | None, processes: list[tuple[int, int, str]]) -> str:
    """The panel's words: the service's (what happens, and when), then the processes that hold."""
    if not over_warning(allocation):
        return ""
    alloc = _mapping(allocation)
    words = _mapping(alloc.get("over_slice_return")).get("words")
    text = words if isinstance(words, str) and words else "This server holds more GPU memory than its slice."
    holding = [(held, what) for _pid, held, what in processes if held > 0]
    if holding:
        names = ", ".join(f"{what} {held / 1024 / MIB:.1f} GiB" for held, what in holding[:5])
        text += f" Its GPU processes: {names}."
    return text
