"""A request body refused with 413 as it streams in, before it is read whole or parsed, and
before the caller is authenticated (the extender's verbs, the hub service's routes).

tornado reads a body whole (up to its ``max_body_size``, 100 MiB by default) before a handler
sees it, so N callers that send large bodies hold N times that. A handler that mixes
:class:`LimitedBody` in streams instead (``@tornado.web.stream_request_body``): a
``Content-Length`` past the limit is refused when the headers are read, a chunked body as soon as
the bytes received pass it, and nothing beyond the limit is kept. Its server's own
``max_body_size`` is set far above the limit (:data:`SERVER_MAX_BODY`), since tornado's refusal
drops the connection without an answer.

The refusal is sent at once, and the rest of the body is then read and dropped for a while
(:data:`LINGER_SECONDS`, :data:`LINGER_BYTES`) before the connection is closed, as servers do
for a lingering close: a connection closed with unread bytes is reset, and a reset can reach the
client (a proxy in front, configurable-http-proxy for the hub service) before the answer does,
which it then reports as a 503 of its own. A body that ends within the linger leaves the
connection open.
"""

from __future__ import annotations

import functools
from asyncio import Future
from collections.abc import Callable
from typing import Any

import tornado.web
from tornado.ioloop import IOLoop

from gpushare_hub.core.digits import ascii_int

# The HTTPServer's max_body_size where LimitedBody answers: far above any handler's limit.
SERVER_MAX_BODY = 1 << 40
# After a refusal: how long, and how much more of the body, is read and dropped before the
# connection is closed (the client has the answer by then; it just stops sending).
LINGER_SECONDS = 2.0
LINGER_BYTES = 1 << 20
METHODS = ("get", "head", "post", "put", "patch", "delete", "options")


def _unless_refused(method: Callable[..., Any]) -> Callable[..., Any]:
    """A handler's method, which tornado calls once the body has arrived: skipped (the answer
    was sent) when the body was refused."""

    @functools.wraps(method)
    def guarded(self: LimitedBody, *args: Any, **kwargs: Any) -> Any:
        if self._refusal_sent:
            self._stop_lingering()
            return None
        return method(self, *args, **kwargs)

    guarded.unless_refused = True  # type: ignore[attr-defined]
    return guarded


@tornado.web.stream_request_body
class LimitedBody(tornado.web.RequestHandler):
    """A handler whose body streams in and is refused past :meth:`body_limit` bytes.

    Call :meth:`start_body` from ``prepare``; read :attr:`body` in the method; answer the
    refusal in the handler's own format in :meth:`body_too_large`, which must finish the
    response (the finish sends it, and the connection lingers: see the module)."""

    _chunks: list[bytes]
    _size: int = 0
    _refusing = False  # body_too_large is answering
    _refusal_sent = False  # the 413 is on the wire; the rest of the body is being dropped
    _refused_at = 0
    _linger: object | None = None
    _sent: Future[None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every HTTP method of a handler, its own or inherited (from any base), is skipped
        once its body was refused."""
        super().__init_subclass__(**kwargs)
        for name in METHODS:
            method = getattr(cls, name)
            if not getattr(method, "unless_refused", False):
                setattr(cls, name, _unless_refused(method))

    def body_limit(self) -> int:
        """The largest body accepted, in bytes: the application's ``max_body_bytes`` setting."""
        return int(self.settings["max_body_bytes"])

    def body_too_large(self, size: int, limit: int) -> None:
        raise NotImplementedError  # each handler answers in its own format

    def start_body(self) -> None:
        """Refuse a declared ``Content-Length`` past the limit before a byte of the body is read."""
        self._chunks = []
        self._size = 0
        if self._finished:
            return
        raw = (self.request.headers.get("Content-Length") or "0").strip()
        declared = ascii_int(raw, len(str(SERVER_MAX_BODY)))  # tornado refuses anything longer
        if declared is not None and declared > self.body_limit():
            # tornado would send "100 Continue" after the refusal once prepare() returns.
            self.request.headers.pop("Expect", None)
            self._refuse(declared)

    def data_received(self, chunk: bytes) -> None:
        if self._finished:
            return
        self._size += len(chunk)
        if self._refusal_sent:
            if self._size - self._refused_at > LINGER_BYTES:
                self._stop_lingering()
            return
        if self._size > self.body_limit():
            self._chunks = []
            self._refuse(self._size)
            return
        self._chunks.append(chunk)

    def _refuse(self, size: int) -> None:
        self._refusing = True
        self._refused_at = self._size
        try:
            self.body_too_large(size, self.body_limit())
        finally:
            self._refusing = False

    def finish(self, chunk: str | bytes | dict[str, Any] | None = None) -> Future[None]:
        """As tornado's; the refusal of a body is sent without finishing, and finished once the
        body has arrived, or the linger is over (then the connection is closed)."""
        if not self._refusing:
            return super().finish(chunk)
        if self._refusal_sent:  # send_error finishes again after write_error did
            return self._sent
        if chunk is not None:
            self.write(chunk)
        # No "Connection: close": a proxy that reads it drops the connection once the answer
        # has come, while it still sends the body, and reports the broken pipe as a 503 of its own.
        self.set_header("Content-Length", sum(len(part) for part in self._write_buffer))
        self._refusal_sent = True
        self._linger = IOLoop.current().call_later(LINGER_SECONDS, self._stop_lingering)
        self._sent = self.flush()
        return self._sent

    def _stop_lingering(self) -> None:
        if self._linger is not None:
            IOLoop.current().remove_timeout(self._linger)
            self._linger = None
        if not self._finished:
            super().finish()

    def on_connection_close(self) -> None:
        if self._linger is not None:  # the client went away: nothing more to drop
            IOLoop.current().remove_timeout(self._linger)
            self._linger = None
        super().on_connection_close()

    @property
    def body(self) -> bytes:
        return b"".join(getattr(self, "_chunks", ()))
