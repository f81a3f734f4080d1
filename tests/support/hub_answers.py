"""The hub service's answers of one hub-tier run, kept under out/hub-service as examples to read
(``keep``; GPUSHARE_HUB_OUT overrides the folder)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

# The answers of one run land here (repository's out/, ignored by git), as examples to read.
OUT = Path(os.environ.get("GPUSHARE_HUB_OUT", Path(__file__).resolve().parents[2] / "out" / "hub-service"))


def keep(name: str, body: Any) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / name).write_text(body if isinstance(body, str) else json.dumps(body, indent=1))
