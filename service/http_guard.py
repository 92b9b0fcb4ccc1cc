"""uvicorn's HTTP and websocket protocols, guarded at the service's edge.

`GuardedHTTPProtocol` extends the httptools implementation, which `uvicorn[standard]` (the
`[serve]` extra) always installs and uvicorn's `auto` would pick, with four guards:

- A request-head timeout and the configured keep-alive. uvicorn closes idle keep-alive
  connections, but a connection that sends part of a request head (slowloris), on opening or
  after a response, stays open for ever: the keep-alive timer stops at the first byte and
  nothing else is armed until the head is complete. A timer is armed whenever a connection waits
  for a request head, and closes the connection if it fires with no request in flight.
- A body deadline: once a head is read, its body must be complete within
  `http_body_timeout_s`, or the connection gets 408 `request_timeout` and is closed (the head
  timer ends with the head, so a body sent a byte at a time was held for ever).
- Bounded pipelining. uvicorn answers pipelined requests one at a time but parses every request
  it reads, and resumes reading after each answer: a client that pipelines without reading the
  answers queues every request it sends (~2.5 kB each; 300,000 `GET /livez` took a server from
  174 to 829 MB). Here the parser is fed at most `FEED_BYTES` at a time, and reading stops while
  `PIPELINE_LIMIT` requests wait or the transport's write buffer is over its high-water mark
  (the client is not reading): the client's own socket then fills and its sends block.
- A connection limit: past `http_max_connections` open connections (websockets included), a new
  connection gets 503 and is closed, so a flood of idle sockets cannot exhaust the process's
  file descriptors. The first `PROBE_ALLOWANCE` connections past it may send one request head
  within `PROBE_HEAD_TIMEOUT_S`: `GET /livez` is answered (a saturated replica is alive, and a
  liveness probe that failed would get it killed); anything else (`/readyz` included: a
  saturated replica is not ready), or no head in time, gets the 503. Either way the connection
  closes after that one answer. Past the allowance, a connection gets the 503 at once, unread.

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
import json
import logging
import time
from typing import Any, NamedTuple

from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from service.config import Settings

logger = logging.getLogger(__name__)
PIPELINE_LIMIT = 16
"""Pipelined requests a connection may have waiting behind the one in flight before reading
stops (browsers and HTTP clients pipeline a handful at most)."""
FEED_BYTES = 8192
"""Largest slice of received bytes handed to the parser at once, so that a read of 256 kB
holding thousands of small requests does not become thousands of queued requests: at most
`PIPELINE_LIMIT` plus one slice's worth (~250 `GET /livez`) are parsed ahead of their turn."""
PROBE_ALLOWANCE = 4
"""Connections past `http_max_connections` that may each send one request head, so that
`GET /livez` is answered on a saturated worker. Each lives for one answer (at most
`PROBE_HEAD_TIMEOUT_S` without a head), so probes sent every few seconds rarely need more than
one or two; past them, connections are refused unread, as all were before: at most this many
more are ever open."""
PROBE_HEAD_TIMEOUT_S = 1.0
"""How long a connection past the limit may take to send its request head (a probe sends it at
once), so that silent sockets cannot hold the allowance for the whole head timeout."""
LIVENESS_PATH = "/livez"
REFUSAL_LOG_INTERVAL_S = 10.0
"""At most one warning per this many seconds about refused connections (a flood would flood
the log)."""


class ConnectionLimits(NamedTuple):
    """The connection guards of `Settings`, read once per worker process."""

    header_timeout_s: float
    keep_alive_s: float
    body_timeout_s: float
    max_connections: int


@functools.cache
def connection_limits() -> ConnectionLimits:
    """The guards from `Settings` (`CDT_HTTP_*`), read once per worker process."""
    settings = Settings()
    return ConnectionLimits(
        settings.http_header_timeout_s,
        settings.http_keep_alive_s,
        settings.http_body_timeout_s,
        settings.http_max_connections,
    )


def error_response(status_line: bytes, code: str, detail: str, field: str | None) -> bytes:
    """A complete `connection: close` answer with the API's error body (`ErrorResponse`)."""
    body = json.dumps({"code": code, "detail": detail, "field": field}).encode()
    head = (
        b"HTTP/1.1 " + status_line + b"\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n"
    )
    return head + body


class GuardedFlowControl(FlowControl):
    """uvicorn's flow control, except that reading stays paused while `may_read` says no
    (uvicorn resumes reading after every answer and on every `receive`)."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedHTTPProtocol) -> None:
        super().__init__(transport)
        self._protocol = protocol

    def resume_reading(self) -> None:
        if self._protocol.may_read():
            super().resume_reading()


class GuardedHTTPProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` with a head timeout, a body deadline, bounded pipelining and a
    connection limit."""

    _last_refusal_log = -REFUSAL_LOG_INTERVAL_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = connection_limits()
        self.timeout_keep_alive = self.limits.keep_alive_s  # type: ignore[assignment]
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._in_body = False  # a head is parsed and its body is not complete yet
        self._unparsed = bytearray()  # received, not parsed yet: reading is paused meanwhile
        self._upgraded = False
        self._running: RequestResponseCycle | None = None  # the request in flight
        self._past_limit = False  # opened past the connection limit: one probe, then closed

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.flow = GuardedFlowControl(transport, self)
        open_connections = len(self.connections)
        if open_connections > self.limits.max_connections + PROBE_ALLOWANCE:
            self._refuse_connection()
            return
        self._past_limit = open_connections > self.limits.max_connections
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._cancel_body_timer()
        self._unparsed.clear()
        running = self._running
        if running is not None and not running.response_complete:
            # uvicorn marks only the newest parsed request as disconnected; with requests
            # queued behind it, the one in flight would write to the closed transport
            running.disconnected = True
            running.message_event.set()
        super().connection_lost(exc)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        if self._past_limit:
            if not self._is_liveness_probe(cycle):
                self._refuse_connection()
                return
            cycle.keep_alive = False  # answered with `connection: close`, so it stays one probe
        self._running = cycle
        super()._start_asgi_task(cycle, app)

    def data_received(self, data: bytes) -> None:
        if not self._unparsed and len(data) <= FEED_BYTES and self._may_parse():
            super().data_received(data)  # the usual case: one small request at a time
        else:
            self._unparsed += data
            self._parse_unparsed()
        self._after_parsing()

    def on_headers_complete(self) -> None:
        self._in_body = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body = False
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing():
            return
        self._await_head()  # the next request's head, on a kept-alive connection
        if self._unparsed:  # the queue shrank: parse what waited
            self._parse_unparsed()
            self._after_parsing()
            self.flow.resume_reading()  # once all of it is parsed and the queue has room

    def handle_websocket_upgrade(self) -> None:
        self._cancel_head_timer()  # the websocket protocol takes the connection over
        if self._past_limit:  # a websocket would hold the connection past the limit
            self._refuse_connection()
            return
        self._in_body, self._upgraded = False, True
        super().handle_websocket_upgrade()

    def pause_writing(self) -> None:
        super().pause_writing()
        self.flow.pause_reading()  # the client is not reading its answers: stop reading too

    def resume_writing(self) -> None:
        super().resume_writing()
        self.flow.resume_reading()  # if nothing else holds it paused

    def may_read(self) -> bool:
        """Whether reading may resume: nothing waits to be parsed, the pipeline is short and
        the client reads its answers."""
        return not self._unparsed and self._may_parse() and not self.flow.write_paused

    def _may_parse(self) -> bool:
        return len(self.pipeline) < PIPELINE_LIMIT and not self._upgraded

    def _parse_unparsed(self) -> None:
        """Feed waiting bytes to the parser a slice at a time while the pipeline has room."""
        while self._unparsed and self._may_parse() and not self.transport.is_closing():
            chunk = bytes(self._unparsed[:FEED_BYTES])
            del self._unparsed[:FEED_BYTES]
            super().data_received(chunk)
        if self._upgraded and self._unparsed:  # frames sent right behind the upgrade request
            data, self._unparsed = bytes(self._unparsed), bytearray()
            self.transport.get_protocol().data_received(data)  # type: ignore[attr-defined]

    def _after_parsing(self) -> None:
        """Hold reading while parsing is held; arm or end the body deadline."""
        if self._upgraded or self.transport.is_closing():
            self._cancel_body_timer()
            return
        if not self.may_read():
            self.flow.pause_reading()
        if self._in_body and self._body_timer is None:
            timeout_s = self.limits.body_timeout_s
            self._body_timer = self.loop.call_later(timeout_s, self._body_timed_out)
        elif not self._in_body:
            self._cancel_body_timer()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if not self._in_body or self.transport.is_closing():
            return
        if self.flow.read_paused and not self.flow.write_paused:
            self._after_parsing()  # this side holds the body back (a busy pipeline): wait on
            return
        cycle = self.cycle  # the request whose body is late; answered only if it is in flight
        if cycle is not None and cycle is self._running and not cycle.response_started:
            detail = f"the request body did not arrive within {self.limits.body_timeout_s:g} s"
            timed_out = error_response(b"408 Request Timeout", "request_timeout", detail, "body")
            self.transport.write(timed_out)
        self.transport.close()

    def _is_liveness_probe(self, cycle: RequestResponseCycle) -> bool:
        return cycle.scope["method"] == "GET" and cycle.scope["path"] == (
            self.root_path + LIVENESS_PATH
        )

    def _refuse_connection(self) -> None:
        now = time.monotonic()
        if now - GuardedHTTPProtocol._last_refusal_log >= REFUSAL_LOG_INTERVAL_S:
            GuardedHTTPProtocol._last_refusal_log = now
            logger.warning(
                "refusing connections: %d open, CDT_HTTP_MAX_CONNECTIONS is %d",
                len(self.connections) - 1,
                self.limits.max_connections,
            )
        detail = "the server holds its maximum of open connections; retry later"
        refusal = error_response(b"503 Service Unavailable", "too_many_connections", detail, None)
        self.transport.write(refusal)
        self.transport.close()

    def _await_head(self) -> None:
        self._cancel_head_timer()
        if not self.transport.is_closing():
            timeout_s = self.limits.header_timeout_s
            if self._past_limit:
                timeout_s = min(timeout_s, PROBE_HEAD_TIMEOUT_S)
            self._head_timer = self.loop.call_later(timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        # the same "no request in flight" test uvicorn's graceful shutdown uses
        if self.cycle is None or self.cycle.response_complete:
            if self._past_limit:  # the answer it would have had at once without the allowance
                self._refuse_connection()
            else:
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
