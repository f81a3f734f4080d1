"""Where the hub-managed service listens: a free loopback port, or the address a URL names."""

from __future__ import annotations

import socket
import threading
from typing import Any
from urllib.parse import urlparse

_HANDED_OUT: set[int] = set()  # ports free_port gave, perhaps not yet bound by whoever asked
_HANDED_OUT_LOCK = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, and that this process has not handed
    out before: two ports asked for in turn, both bound later, must not be the same one (the
    kernel hands a port out again once its probe socket is closed)."""
    with _HANDED_OUT_LOCK:
        for _ in range(64):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _HANDED_OUT:
                break
        _HANDED_OUT.add(port)
        return port


def listen_on(url: str, port: int | None) -> dict[str, Any]:
    """The service's ``ip`` and ``port`` for a ``url`` the proxy reaches it at (checked here)."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.path not in ("", "/"):
        raise ValueError(
            f"configure_hub(url={url!r}): give the service's address as http://HOST:PORT, "
            "for example http://hub:10101 (the hub's Kubernetes Service) in Zero to JupyterHub"
        )
    try:
        url_port = parsed.port
    except ValueError as err:
        raise ValueError(f"configure_hub(url={url!r}): {err}; give a port from 1 to 65535") from None
    if url_port is None:
        raise ValueError(f"configure_hub(url={url!r}): the URL needs a port, e.g. http://hub:10101")
    if port is not None and port != url_port:
        raise ValueError(
            f"configure_hub(url={url!r}, port={port}): the two ports differ; leave out port, "
            "the URL's is the one the service listens on"
        )
    loopback = parsed.hostname in ("localhost", "::1") or parsed.hostname.startswith("127.")
    return {"ip": parsed.hostname if loopback else "0.0.0.0", "port": url_port}
