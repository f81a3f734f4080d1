"""The start-up hook's test frameworks: the demo's fake torch in a folder of its own
(``fake_site``), fake CuPy and JAX (``FAKE_FRAMEWORKS``), and the files of such a folder put into a
notebook's working directory (``upload``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpushare_hub.demo.fakegpu import write_site
from gpushare_hub.localcluster.hub import LocalHub

# A fake ``cupy`` and a fake ``jax`` (device memory as bookkeeping, modelled on their APIs where the
# hook touches them: see each package's docstring), in a folder whose name no import can reach.
FAKE_FRAMEWORKS = Path(__file__).parent / "fake-frameworks"


def fake_site(root: Path, torch_version: str = "2.4.0") -> Path:
    """The fake torch (gpushare_hub.demo.fakegpu) in a folder of its own, as torch ``torch_version``."""
    return write_site(root / f"site-{torch_version}", torch_version)


def hooked_env(tmp_path: Path, ledger: Path, **extra: str) -> dict[str, str]:
    """A process of a 5 GiB slice of a 15 GiB card as Allocate starts it: the start-up hook and the
    fake torch on its path, the container ledger in ``ledger``; ``extra`` on top."""
    from gpushare_hub.isolation.hookfiles import HOOK_DIR

    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), str(fake_site(tmp_path))]),
        "PYTHONDONTWRITEBYTECODE": "1",
        "GPUSHARE_LEDGER_DIR": str(ledger),
        "GPUSHARE_MEMORY_LIMIT_MIB": "5120",
        "GPUSHARE_CARD_MEMORY_MIB": "15360",
        **extra,
    }


def upload(hub: LocalHub, user: str, token: str, root: Path) -> None:
    """Put the files under ``root`` into the notebook's working directory (the Contents API)."""
    base = f"{hub.url}/user/{user}/api/contents"
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_dir():
            body: dict[str, Any] = {"type": "directory"}
        else:
            body = {"type": "file", "format": "text", "content": path.read_text()}
        status, reply = hub.request("PUT", f"{base}/{rel}", token, body)
        assert status in (200, 201), (rel, status, reply)
