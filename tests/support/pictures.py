"""Screenshots of the browser tier: each test's under out/browser (``OUT``), and the docs' pictures
(``DOCS_IMAGES``, only when GPUSHARE_DOCS_IMAGES names a folder: see CONTRIBUTING.md, "Screenshots")."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Screenshots land here (repository's out/, ignored by git); GPUSHARE_BROWSER_OUT overrides.
OUT = Path(os.environ.get("GPUSHARE_BROWSER_OUT", Path(__file__).resolve().parents[2] / "out" / "browser"))

# The README's pictures: written only when asked for, at one viewport, from a clean demo scene.
DOCS_IMAGES = Path(os.environ["GPUSHARE_DOCS_IMAGES"]) if os.environ.get("GPUSHARE_DOCS_IMAGES") else None
DOCS_VIEWPORT = {"width": 1280, "height": 800}


def docs_picture(page: Any, name: str) -> None:
    """Save ``name`` into GPUSHARE_DOCS_IMAGES (when set) as the visitor sees it at DOCS_VIEWPORT."""
    if DOCS_IMAGES is None:
        return
    DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size(DOCS_VIEWPORT)
    page.screenshot(path=str(DOCS_IMAGES / name))


def picture(locator: Any, name: str) -> None:
    """One part of a page, as out/browser/<name> and (when asked) the docs' picture."""
    locator.screenshot(path=str(OUT / name))
    if DOCS_IMAGES is not None:
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        locator.screenshot(path=str(DOCS_IMAGES / name))
