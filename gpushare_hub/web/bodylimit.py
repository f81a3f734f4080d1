"""A request body refused with 413 as it streams in, before it is read whole or parsed, and
before the caller is authenticated (the extender's verbs, the hub service's routes).

tornado reads a body whole (up to its ``max_body_size``, 100 MiB by default) before a handler
sees it, so N callers that send large bodies hold N times that. A handler that mixes
:class:`LimitedBody` in streams instead (``@tornado.web.stream_request_body``): a
``Content-Length`` past the limit is refused when the headers are read, a chunked body as soon as
the bytes received pass it, and nothing beyond the limit is kept. Its server's own
``max_body_size`` is set far above the limit (:data:`SERVER_MAX_BODY`), since tornado's refusal
drops the connection without an answer.
"""

from __future__ import annotations

import tornado.web

from gpushare_hub.core.digits import ascii_int

# The HTTPServer's max_body_size where LimitedBody answers: far above any handler's limit.
SERVER_MAX_BODY = 1 << 40


@tornado.web.stream_request_body
class LimitedBody(tornado.web.RequestHandler):
    """A handler whose body streams in and is refused past :meth:`body_limit` bytes.

    Call :meth:`start_body` from ``prepare``; read :attr:`body` in the method; answer the
    refusal in the handler's own format in :meth:`body_too_large`, which must finish the
    response."""

    _chunks: list[bytes]
    _size: int = 0

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
            self.body_too_large(declared, self.body_limit())

    def data_received(self, chunk: bytes) -> None:
        if self._finished:
            return
        self._size += len(chunk)
        if self._size > self.body_limit():
            self._chunks = []
            self.body_too_large(self._size, self.body_limit())
            return
        self._chunks.append(chunk)

    @property
    def body(self) -> bytes:
        return b"".join(getattr(self, "_chunks", ()))
