"""A real OCI registry on 127.0.0.1 (CNCF distribution's ``registry``, built from its Go module
by :mod:`.runtimebuild`), as ghcr.io is to a release: the release targets push images and the
chart to it in the tests, and what they pushed is read back through its API."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from .processes import free_port
from .runtimebuild import REGISTRY, build_part


class LocalRegistry:
    """``with LocalRegistry(folder) as reg:`` serves ``reg.address`` (``127.0.0.1:<port>``) over
    plain HTTP, storing under ``folder``, until the block ends."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalRegistry:
        binary = build_part(REGISTRY) / "registry"
        self.folder.mkdir(parents=True, exist_ok=True)
        config = self.folder / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.folder / 'data'}\n"
            f"http:\n  addr: {self.address}\n"
        )
        log = (self.folder / "registry.log").open("wb")
        self._proc = subprocess.Popen([str(binary), "serve", str(config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                self.get("/v2/")
                return self
            except OSError:
                if self._proc.poll() is not None:
                    break
                time.sleep(0.2)
        self.__exit__(None, None, None)
        raise RuntimeError(f"the registry did not start; its log: {self.folder / 'registry.log'}")

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(10)

    def get(self, path: str, accept: str = "application/json") -> Any:
        """``GET http://<address><path>``, parsed as JSON."""
        request = urllib.request.Request(f"http://{self.address}{path}", headers={"Accept": accept})
        with urllib.request.urlopen(request, timeout=10) as resp:
            return json.loads(resp.read() or b"null")

    def digest(self, repository: str, tag: str) -> str:
        """The digest the registry serves ``repository:tag``'s manifest under (what a node that
        pulled it records as the image's repo digest)."""
        accept = (
            "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
        )
        request = urllib.request.Request(
            f"http://{self.address}/v2/{repository}/manifests/{tag}",
            method="HEAD",
            headers={"Accept": accept},
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            return str(resp.headers["Docker-Content-Digest"])

    def tags(self, repository: str) -> list[str]:
        return sorted(self.get(f"/v2/{repository}/tags/list").get("tags") or [])
