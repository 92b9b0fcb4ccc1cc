"""The guarded protocols: a real uvicorn server in a thread, probed with raw sockets and a
websocket client."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from websockets.sync.client import connect

from service.config import Settings
from service.http_guard import (
    FEED_BYTES,
    PIPELINE_LIMIT,
    GuardedHTTPProtocol,
    connection_limits,
    is_utf8,
)
from service.main import create_app
from service.repository import ModelRepository
from service.schemas import ReloadResult
from tests.service.live_server import captured_logs, live_server

TIMEOUT_S = 0.2
"""Header and keep-alive timeout of the test server; sockets wait up to 10 s for its close."""
REQUEST = b"GET /livez HTTP/1.1\r\nHost: test\r\n\r\n"
PARTIAL_HEAD = b"GET /livez HTTP/1.1\r\nHost: test\r\n"
START = json.dumps(
    {"type": "start", "model": "toy", "target_reward": 1.0, "target_cost": 1.0}
    | {"observation": [0.0, 0.0, 0.0]}
)


@contextmanager
def guarded_server(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, **limits: float
) -> Iterator[int]:
    """Serve the app with the guarded protocols, `CDT_HTTP_<LIMIT>` set from `limits`."""
    for name, value in limits.items():
        monkeypatch.setenv(f"CDT_HTTP_{name.upper()}", str(value))
    connection_limits.cache_clear()
    try:
        with live_server(create_app(settings)) as served_port:
            yield served_port
    finally:
        connection_limits.cache_clear()


@pytest.fixture
def port(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Serve the app with the guarded protocols on a free port of 127.0.0.1."""
    limits = {"header_timeout_s": TIMEOUT_S, "keep_alive_s": TIMEOUT_S, "body_timeout_s": 1.0}
    with guarded_server(settings, monkeypatch, **limits) as served_port:
        yield served_port


def open_connection(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_response(connection: socket.socket) -> bytes:
    """The status line of one response (its body read and dropped)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += receive(connection)
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
    while length is not None and len(body) < int(length.group(1)):
        body += receive(connection)
    return head.split(b"\r\n")[0]


def receive(connection: socket.socket) -> bytes:
    chunk = connection.recv(65536)
    assert chunk, "the server closed the connection mid-response"
    return chunk


def test_partial_request_head_is_closed(port: int) -> None:
    with open_connection(port) as connection:
        connection.sendall(PARTIAL_HEAD)
        assert connection.recv(1024) == b""  # closed; a socket timeout would mean held open


def test_partial_head_after_a_response_is_closed(port: int) -> None:
    with open_connection(port) as connection:
        connection.sendall(REQUEST)
        assert read_response(connection) == b"HTTP/1.1 200 OK"
        connection.sendall(PARTIAL_HEAD)  # stops uvicorn's keep-alive timer
        assert connection.recv(1024) == b""


def test_kept_alive_connection_serves_requests_then_closes_when_idle(port: int) -> None:
    with open_connection(port) as connection:
        for _ in range(2):
            connection.sendall(REQUEST)
            assert read_response(connection) == b"HTTP/1.1 200 OK"
        assert connection.recv(1024) == b""


def test_request_slower_than_the_header_timeout_is_answered(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    def slow_reload(self: ModelRepository) -> ReloadResult:
        time.sleep(2 * TIMEOUT_S)
        return ReloadResult(loaded=[], unchanged=[], removed=[], failed=[])

    monkeypatch.setattr(ModelRepository, "reload", slow_reload)
    with open_connection(port) as connection:
        connection.sendall(
            b"POST /v1/admin/reload HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"
        )
        assert read_response(connection) == b"HTTP/1.1 200 OK"


def test_websocket_outlives_the_header_timeout(port: int) -> None:
    with connect(f"ws://127.0.0.1:{port}/v1/stream", open_timeout=10) as websocket:
        time.sleep(2 * TIMEOUT_S)  # past the head timer the upgrade must have cancelled
        websocket.send(START)
        assert json.loads(websocket.recv(timeout=10))["type"] == "action"


def test_websocket_text_frame_that_is_not_utf8_is_an_ordinary_invalid_frame(port: int) -> None:
    with (
        captured_logs() as logs,
        connect(f"ws://127.0.0.1:{port}/v1/stream", open_timeout=10) as websocket,
    ):
        for _ in range(2):
            websocket.send(b'{"type": "end", "episode_id": "\xff"}', text=True)
            error = json.loads(websocket.recv(timeout=10))
            assert (error["type"], error["status"], error["code"]) == (
                "error",
                422,
                "validation_error",
            )
        websocket.send(START)  # the socket stays open for its other episodes
        assert json.loads(websocket.recv(timeout=10))["type"] == "action"
    assert max(logs.levels, default=logging.NOTSET) < logging.ERROR, logs.lines
    assert not [line for line in logs.lines if "Traceback" in line]


def test_pipelined_requests_are_parsed_only_a_few_ahead_of_their_answers(
    port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that pipelines without reading (issue 30: 300,000 `GET /livez` queued 650 MB)."""
    queued: list[int] = []
    parse_head = GuardedHTTPProtocol.on_headers_complete

    def counting(self: GuardedHTTPProtocol) -> None:
        parse_head(self)
        queued.append(len(self.pipeline))

    monkeypatch.setattr(GuardedHTTPProtocol, "on_headers_complete", counting)
    with open_connection(port) as connection:
        connection.settimeout(1.0)
        with contextlib.suppress(TimeoutError):  # the server stopped reading: sends block
            connection.sendall(REQUEST * 20_000)  # 700 kB, never read
        time.sleep(0.5)
    per_slice = FEED_BYTES // len(REQUEST) + 1
    assert 0 < max(queued) <= PIPELINE_LIMIT + per_slice


def test_pipelined_requests_are_all_answered_when_read(port: int) -> None:
    with open_connection(port) as connection:
        connection.sendall(REQUEST * 300)  # 10 kB: more than one parser slice
        answers = b""
        while answers.count(b"HTTP/1.1 ") < 300:
            answers += receive(connection)
        assert answers.count(b"HTTP/1.1 200 OK") == 300


def test_body_slower_than_the_body_timeout_gets_408_and_is_closed(port: int) -> None:
    with open_connection(port) as connection:
        connection.sendall(b"POST /v1/episodes HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n")
        began = time.monotonic()
        answer = b""
        with contextlib.suppress(OSError):  # sending into a socket the server closed
            while not answer and time.monotonic() - began < 5.0:
                connection.sendall(b"{")  # one byte every 0.1 s, still before the head timeout
                time.sleep(0.1)
                connection.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    answer = connection.recv(65536)
                connection.setblocking(True)
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b'"code": "request_timeout"' in answer
        assert time.monotonic() - began < 3.0


def test_body_sent_in_parts_within_the_body_timeout_is_answered(port: int) -> None:
    body = json.dumps({"model": "toy", "target_reward": 1.0, "target_cost": 1.0}).encode()
    with open_connection(port) as connection:
        head = f"POST /v1/episodes HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
        connection.sendall(head.encode() + body[:10])
        time.sleep(0.3)  # past the head timeout: the body has its own deadline
        connection.sendall(body[10:])
        assert read_response(connection) == b"HTTP/1.1 422 Unprocessable Entity"  # no observation


def test_connection_past_the_limit_gets_503_and_is_closed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    with guarded_server(settings, monkeypatch, max_connections=3) as served_port:
        held = [open_connection(served_port) for _ in range(3)]
        try:
            for connection in held:  # all three are served
                connection.sendall(REQUEST)
                assert read_response(connection) == b"HTTP/1.1 200 OK"
            with open_connection(served_port) as refused:
                answer = refused.recv(65536)
                assert answer.startswith(b"HTTP/1.1 503 "), answer
                assert b"too_many_connections" in answer
        finally:
            for connection in held:
                connection.close()
        time.sleep(0.2)  # the server notices the closes
        with open_connection(served_port) as connection:  # a freed slot is usable again
            connection.sendall(REQUEST)
            assert read_response(connection) == b"HTTP/1.1 200 OK"


@pytest.mark.parametrize(
    ("fragments", "expected"),
    [([b"{}"], True), (["é".encode(), b"x"], True), ([b"\xc3", b"\xa9"], True), ([b"\xff"], False)],
)
def test_is_utf8_checks_the_whole_message(fragments: list[bytes], expected: bool) -> None:
    assert is_utf8(fragments) is expected
