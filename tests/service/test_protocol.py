"""`GuardedHTTPProtocol`: a real uvicorn server in a thread, probed with raw sockets."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from websockets.sync.client import connect

from service.config import Settings
from service.main import create_app
from service.protocol import GuardedHTTPProtocol, connection_timeouts
from service.repository import ModelRepository
from service.schemas import ReloadResult

TIMEOUT_S = 0.2
"""Header and keep-alive timeout of the test server; sockets wait up to 10 s for its close."""
REQUEST = b"GET /livez HTTP/1.1\r\nHost: test\r\n\r\n"
PARTIAL_HEAD = b"GET /livez HTTP/1.1\r\nHost: test\r\n"


@pytest.fixture
def port(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Serve the app with the guarded protocol on a free port of 127.0.0.1."""
    monkeypatch.setenv("CDT_HTTP_HEADER_TIMEOUT_S", str(TIMEOUT_S))
    monkeypatch.setenv("CDT_HTTP_KEEP_ALIVE_S", str(TIMEOUT_S))
    connection_timeouts.cache_clear()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(settings), http=GuardedHTTPProtocol, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]})
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.01)
    yield int(listener.getsockname()[1])
    server.should_exit = True
    thread.join(timeout=10)
    listener.close()
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
    start = {"type": "start", "model": "toy", "target_reward": 1.0, "target_cost": 1.0}
    with connect(f"ws://127.0.0.1:{port}/v1/stream", open_timeout=10) as websocket:
        time.sleep(2 * TIMEOUT_S)  # past the head timer the upgrade must have cancelled
        websocket.send(json.dumps(start | {"observation": [0.0, 0.0, 0.0]}))
        assert json.loads(websocket.recv(timeout=10))["type"] == "action"
