"""The hub service's ``api/v1/me`` document, read by the notebook server itself.

With the server's own token (``$JUPYTERHUB_API_TOKEN``) from ``$GPUSHARE_SERVICE_URL`` +
``api/v1/me``; 3 s at most; the answer (a failure included) is kept for 5 s, so that any number
of open JupyterLab tabs cost the service one request per 5 s. Every failure becomes words
(``hub service unreachable: ...``), never an exception.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .status import UNREACHABLE, me_url

TIMEOUT_S = 3.0
KEEP_S = 5.0
TOKEN_ENV = "JUPYTERHUB_API_TOKEN"

Answer = tuple[dict[str, Any] | None, str]


def _reason(err: BaseException) -> str:
    if isinstance(err, HTTPClientError) and err.code == 599:
        text = str(err.message or err)
        return f"timed out after {TIMEOUT_S:g} s" if "timeout" in text.lower() else text
    if isinstance(err, OSError) and err.strerror:
        return err.strerror.lower()
    return str(err) or type(err).__name__


class HubMe:
    """Reads and keeps the caller's ``api/v1/me`` document; one per server process."""

    def __init__(self, keep_s: float = KEEP_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.keep_s = keep_s
        self.clock = clock
        self._kept: tuple[float, tuple[str, str], Answer] | None = None
        self._lock = asyncio.Lock()

    def forget(self) -> None:
        """Read the service again at the next call (after this server changed something there)."""
        self._kept = None

    async def read(self, env: Mapping[str, str]) -> Answer:
        """``(document, "")`` or ``(None, problem)``."""
        url, problem = me_url(env)
        if problem:
            return None, problem
        token = env.get(TOKEN_ENV, "")
        if not token:
            return None, f"{UNREACHABLE}: this server has no ${TOKEN_ENV} to show the service"
        key = (url, token)
        async with self._lock:
            kept = self._kept
            if kept is not None and kept[1] == key and self.clock() - kept[0] < self.keep_s:
                return kept[2]
            answer = await fetch(url, token)
            self._kept = (self.clock(), key, answer)
            return answer


async def fetch(url: str, token: str) -> Answer:
    """One request; the document if the service answered 200 with a JSON object."""
    request = HTTPRequest(
        url,
        headers={"Authorization": f"token {token}", "Accept": "application/json"},
        connect_timeout=TIMEOUT_S,
        request_timeout=TIMEOUT_S,
        follow_redirects=False,
    )
    try:
        response = await AsyncHTTPClient().fetch(request, raise_error=False)
    except Exception as err:  # a network call: every failure is words for the user
        return None, f"{UNREACHABLE}: {_reason(err)}"
    if response.code != 200:
        hint = (
            " (the server's token may lack access:services!service=gpushare)"
            if response.code
            in (
                302,
                403,
            )
            else ""
        )
        return None, f"{UNREACHABLE}: HTTP {response.code} {response.reason}{hint}"
    try:
        doc = json.loads(response.body)
    except ValueError:
        return None, f"{UNREACHABLE}: its answer is not JSON"
    if not isinstance(doc, dict):
        return None, f"{UNREACHABLE}: its answer is not a JSON object"
    return doc, ""


async def keep(env: Mapping[str, str], server: str) -> tuple[int, dict[str, Any]]:
    """``POST api/v1/me/keep`` for this server, with its own token: (HTTP status, the answer);
    a failure to reach the service is a 502 with the words."""
    url, problem = me_url(env)
    token = env.get(TOKEN_ENV, "")
    if problem or not token:
        return 502, {"message": problem or f"{UNREACHABLE}: this server has no ${TOKEN_ENV}"}
    request = HTTPRequest(
        url.rstrip("/") + "/keep",
        method="POST",
        body=json.dumps({"server": server}),
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        connect_timeout=TIMEOUT_S,
        request_timeout=TIMEOUT_S,
        follow_redirects=False,
    )
    try:
        response = await AsyncHTTPClient().fetch(request, raise_error=False)
    except Exception as err:  # a network call: every failure is words for the user
        return 502, {"message": f"{UNREACHABLE}: {_reason(err)}"}
    try:
        doc = json.loads(response.body or b"{}")
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return 502, {"message": f"{UNREACHABLE}: HTTP {response.code}, an answer that is not JSON"}
    return response.code, doc
