"""uvicorn's HTTP and websocket protocols, guarded at the service's edge.

`GuardedHTTPProtocol` adds a request-head timeout and the configured keep-alive. uvicorn closes
idle keep-alive connections, but a connection that sends part of a request head (slowloris), on
opening or after a response, stays open for ever: the keep-alive timer stops at the first byte
and nothing else is armed until the head is complete. This protocol arms a timer whenever a
connection waits for a request head and closes the connection if it fires with no request in
flight. It extends the httptools implementation, which `uvicorn[standard]` (the `[serve]` extra)
always installs and uvicorn's `auto` would pick.

`GuardedWebSocketProtocol` hands a text frame that is not UTF-8 to the app as a binary frame,
which answers it like any other undecodable frame (an `error` frame; the socket stays open for
its other episodes). uvicorn's own protocol logs an ERROR traceback for it and closes the socket
with 1007, the close RFC 6455 section 8.1 asks for; a client's bad bytes are not a server error,
and the API's rule is that one bad frame costs no other episode. It extends the
websockets-sansio implementation, which uvicorn's `auto` picks.

Select them with `uvicorn --http service.http_guard:GuardedHTTPProtocol --ws
service.http_guard:GuardedWebSocketProtocol` (the image's CMD) or `cdt serve`.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from service.config import Settings


@functools.cache
def connection_timeouts() -> tuple[float, float]:
    """(request head, keep-alive) seconds from `Settings`, read once per worker process."""
    settings = Settings()
    return settings.http_header_timeout_s, settings.http_keep_alive_s


class GuardedHTTPProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` that closes connections slow to send a request head."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.header_timeout_s, keep_alive_s = connection_timeouts()
        self.timeout_keep_alive = keep_alive_s  # type: ignore[assignment]  # call_later takes float
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_head()  # the next request's head, on a kept-alive connection

    def handle_websocket_upgrade(self) -> None:
        self._cancel_head_timer()  # the websocket protocol takes the connection over
        super().handle_websocket_upgrade()

    def _await_head(self) -> None:
        self._cancel_head_timer()
        if not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        # the same "no request in flight" test uvicorn's graceful shutdown uses
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """`WebSocketsSansIOProtocol` that passes a text frame that is not UTF-8 on as bytes."""

    def send_receive_event_to_app(self) -> None:
        if self.curr_msg_data_type == "text" and not is_utf8(self.frames):
            self.curr_msg_data_type = "bytes"  # the app answers an undecodable frame
        super().send_receive_event_to_app()


def is_utf8(fragments: list[bytes]) -> bool:
    """Whether a message's fragments decode as UTF-8 (JSON frames are mostly ASCII: fast)."""
    data = fragments[0] if len(fragments) == 1 else b"".join(fragments)
    if data.isascii():
        return True
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True
