"""The guarded protocols: a real uvicorn server in a thread, probed with raw sockets and a
websocket client."""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections.abc import Iterator

import pytest
from websockets.sync.client import connect

from service.config import Settings
from service.http_guard import connection_timeouts, is_utf8
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


@pytest.fixture
def port(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Serve the app with the guarded protocols on a free port of 127.0.0.1."""
    monkeypatch.setenv("CDT_HTTP_HEADER_TIMEOUT_S", str(TIMEOUT_S))
    monkeypatch.setenv("CDT_HTTP_KEEP_ALIVE_S", str(TIMEOUT_S))
    connection_timeouts.cache_clear()
    with live_server(create_app(settings)) as served_port:
        yield served_port
    connection_timeouts.cache_clear()


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


@pytest.mark.parametrize(
    ("fragments", "expected"),
    [([b"{}"], True), (["é".encode(), b"x"], True), ([b"\xc3", b"\xa9"], True), ([b"\xff"], False)],
)
def test_is_utf8_checks_the_whole_message(fragments: list[bytes], expected: bool) -> None:
    assert is_utf8(fragments) is expected
