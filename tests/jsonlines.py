"""A test shim process that takes one JSON command per line on stdin and answers one JSON line on
stdout (the kubelet tier's device manager, the fuzz tier's kubelet client)."""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support.pipes import readable


class JsonLineShim:
    def __init__(self, argv: list[str], log: Path, ready_timeout: float = 30) -> None:
        self.log = log
        self.name = Path(argv[0]).name
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("ab"), text=True, bufsize=1
        )
        first = self._read(ready_timeout)
        assert first.get("ready"), first

    def _read(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        if not readable(self.proc.stdout, timeout):
            raise TimeoutError(f"{self.name} did not answer in {timeout}s; log {self.log}")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited ({self.proc.poll()}); log {self.log}")
        result: dict[str, Any] = json.loads(line)
        return result

    def call(self, op: str, timeout: float = 30, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(Exception):
                self.call("quit", timeout=5)
            self.proc.kill()
        self.proc.wait()
