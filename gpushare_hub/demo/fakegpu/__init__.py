"""A fake GPU framework for the tests and the demo: a ``torch`` whose CUDA memory is bookkeeping.

The fake lives in ``site-packages/`` beside this file (package data, in a folder whose name no
import can reach, so ``import torch`` finds it only where someone puts that folder on a path):
``torch/`` (see its docstrings for what it models and the environment it reads) and a
``torch-2.10.0.dist-info`` (the start-up hook reads torch's version from its metadata).

* :func:`site_dir`: the folder to put on ``sys.path`` / ``PYTHONPATH`` (torch 2.10);
* :func:`write_site`: a copy of it elsewhere, with another torch version if wanted (the hook's
  tests compare versions; the hub tests upload a copy into a notebook);
* ``python -m gpushare_hub.demo.fakealloc 3``: hold 3 GiB through it until Ctrl-C.
"""

from __future__ import annotations

import shutil
from pathlib import Path

SITE = Path(__file__).parent / "site-packages"
VERSION = "2.10.0"


def site_dir() -> Path:
    """The folder holding the fake ``torch`` (a torch 2.10 by its metadata)."""
    return SITE


def torch_files() -> list[Path]:
    """The fake torch package's files (``torch/*.py``)."""
    return sorted((SITE / "torch").glob("*.py"))


def write_site(dest: Path, torch_version: str = VERSION) -> Path:
    """Copy the fake torch into ``dest`` (created) with a ``torch-<version>.dist-info``; ``dest``."""
    (dest / "torch").mkdir(parents=True, exist_ok=True)
    for src in torch_files():
        shutil.copyfile(src, dest / "torch" / src.name)
    dist = dest / f"torch-{torch_version}.dist-info"
    dist.mkdir(exist_ok=True)
    metadata = (SITE / f"torch-{VERSION}.dist-info" / "METADATA").read_text()
    (dist / "METADATA").write_text(metadata.replace(f"Version: {VERSION}", f"Version: {torch_version}"))
    return dest
