"""What every POST endpoint of the service port shares: reading a JSON body under a size limit
(a clean 413, never a dropped connection), the API-key check, noticing a client that went away,
and writing a streamed body chunk by chunk.  Subclasses choose the error body's shape (native
or OpenAI) by implementing `send_error_body`.

Only tornado's public API is used: whether a response has ended is our own `finished` flag (set
in `on_finish`), and `reason_phrase` rebuilds the reason `send_error` gives a status.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable
from http.client import responses
from typing import Any

from tornado.http1connection import HTTP1Connection
from tornado.iostream import StreamClosedError
from tornado.web import HTTPError, RequestHandler, stream_request_body

from spmd_serve.frontend.common.parsing import ProtocolError, decode_body

AUTH_HINT = "invalid or missing API key: send 'Authorization: Bearer <API_KEY>'"


def bearer_ok(authorization: str | None, api_key: str | None) -> bool:
    """True when no key is configured or the header is `Bearer <key>` (constant-time compare)."""
    if not api_key:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


# RFC 9112's reason-phrase; tornado's send_error turns any other reason into "Unknown".
_REASON_PHRASE = re.compile(r"[\t \x21-\x7e\x80-\xff]+")


def reason_phrase(status_code: int, write_error_kwargs: dict[str, Any]) -> str:
    """The reason phrase tornado's `send_error` set for this status, from what it passes on to
    `write_error` (an HTTPError's reason, a `reason=` argument, else the standard phrase)."""
    reason = write_error_kwargs.get("reason")
    exc_info = write_error_kwargs.get("exc_info")
    if exc_info is not None and isinstance(exc_info[1], HTTPError) and exc_info[1].reason:
        reason = exc_info[1].reason
    if reason is None:
        return responses.get(status_code, "Unknown")
    return reason if "<" not in reason and _REASON_PHRASE.fullmatch(reason) else "Unknown"


@stream_request_body
class JsonBodyHandler(RequestHandler):
    """Body streaming is on only to answer an oversized body with 413 instead of a reset."""

    def initialize(self, max_body_size: int = 8 << 20, api_key: str | None = None, **kwargs: Any) -> None:
        self.max_body_size, self.api_key = max_body_size, api_key
        self._chunks: list[bytes] | None = []  # None once the body is known to be too big
        self._size = 0
        self.gone = False  # the client closed the connection
        self.started = False  # the response body has begun
        self.finished = False  # finish() has ended the response
        self.on_gone: list[Callable[[], None]] = []  # called once when the client goes away

    def send_error_body(self, status: int, msg: str) -> None:
        raise NotImplementedError

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.send_error_body(status_code, reason_phrase(status_code, kwargs))

    def too_large_msg(self) -> str:
        return f"request body exceeds the limit of {self.max_body_size} bytes"

    def prepare(self) -> None:
        # The server-wide max_body_size would make tornado drop the connection with a bare 400;
        # instead read (and discard) an oversized body so that the client sees a clean 413.
        length = self.request.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > 8 * self.max_body_size:
            # Too big to be worth draining: answer now; tornado closes the connection after.
            self.send_error_body(413, self.too_large_msg())
            return
        connection = self.request.connection
        if isinstance(connection, HTTP1Connection):  # always, under tornado's HTTPServer
            connection.set_max_body_size(8 * self.max_body_size)

    def data_received(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > self.max_body_size:
            self._chunks = None
        elif self._chunks is not None:
            self._chunks.append(chunk)

    def read_json(self) -> dict[str, Any]:
        """The body as a JSON object; ProtocolError (413, 400) otherwise."""
        if self._chunks is None:
            raise ProtocolError(413, self.too_large_msg())
        return decode_body(b"".join(self._chunks))

    def authorized(self) -> bool:
        return bearer_ok(self.request.headers.get("Authorization"), self.api_key)

    def on_finish(self) -> None:
        self.finished = True

    def on_connection_close(self) -> None:
        # Called by tornado when the client goes away while we wait for the engine: stop the
        # generation now so the handler ends and the engine frees the sequence's blocks.
        super().on_connection_close()  # fails a half-read body so the handler cannot hang
        if not self.gone:
            self.gone = True
            for callback in self.on_gone:
                callback()

    async def send_chunk(self, data: str, content_type: str) -> bool:
        """Write and flush one piece of a streamed body now; False when the client is gone."""
        if self.gone:
            return False
        if not self.started:
            self.set_header("Content-Type", content_type)
            self.started = True
        try:
            self.write(data)
            await self.flush()
            return True
        except StreamClosedError:
            self.gone = True
            return False

    async def end(self) -> None:
        """Finish the response unless the client is gone or it is already finished."""
        if not self.gone and not self.finished:
            try:
                await self.finish()
            except StreamClosedError:
                pass
