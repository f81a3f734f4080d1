"""The containers the plugin has served whose pod is not marked assigned yet.

Until the plugin writes ``ALIYUN_COM_GPU_MEM_ASSIGNED=true`` on a pod, only the plugin knows
that its containers were served; this record keeps that knowledge, on disk when a file is
given, so that a plugin restart in between cannot serve a container twice.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

log = logging.getLogger("gpushare.plugin")


class ServedContainers:
    """``keys``: (pod UID, served key) of each container served; ``unmarked``: pod UID -> its
    ``namespace/name``, for pods whose every container is served but the mark is not yet written."""

    def __init__(self, path: str = "") -> None:
        self.path = path
        self.keys: set[tuple[str, str]] = set()
        self.unmarked: dict[str, str] = {}
        self.load()

    def load(self) -> None:
        path = self.path
        if not path or not os.path.exists(path):
            return
        try:
            with open(path) as fh:
                data = json.load(fh)
            self.keys = {(str(u), str(c)) for u, c in data.get("served", [])}
            self.unmarked = {str(k): str(v) for k, v in data.get("unmarked", {}).items()}
        except (OSError, ValueError, TypeError, AttributeError) as err:
            log.error(
                "cannot read %s (%s): containers served before this restart may be matched again; "
                "delete the file if it is damaged",
                path,
                err,
            )
            return
        log.info("%d served container(s) not yet marked on their pods, from %s", len(self.keys), path)

    def save(self) -> None:
        """Written before Allocate answers, so that a restart cannot serve a container twice."""
        path = self.path
        if not path:
            return
        tmp = f"{path}.tmp"
        with open(tmp, "w") as fh:
            json.dump({"served": sorted(self.keys), "unmarked": self.unmarked}, fh)
        os.replace(tmp, path)

    def forget_pod(self, uid: str) -> None:
        """The pod is marked assigned: the API server remembers it from now on."""
        self.unmarked.pop(uid, None)
        self.keys = {s for s in self.keys if s[0] != uid}
        self.save()

    def remove_if_empty(self) -> bool:
        """On the way out: the file goes when it records nothing (every served pod is marked and
        remembered by the API server), so that an uninstall leaves no file of ours on the node."""
        if not self.path or self.keys or self.unmarked:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        return True
