"""The repository's scripts (images/build.py, release/version.py), loaded as modules by the tests
that check them: they live outside the package, run as ``python <path>``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str) -> ModuleType:
    """``path`` as the module ``name`` (registered in ``sys.modules``: dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def require_image_tools() -> None:
    """Fail (not skip) the test naming the Debian packages images/build.py needs."""
    import shutil

    import pytest

    missing = [tool for tool in ("buildah", "debootstrap") if not shutil.which(tool)]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not installed: apt-get install -y buildah debootstrap", pytrace=False
        )
