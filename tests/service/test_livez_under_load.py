"""`GET /livez` on a worker at its connection limit: a real uvicorn server in a thread whose
connections are all held by idle websockets, probed with raw sockets."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from service.config import Settings
from service.http_guard import PROBE_ALLOWANCE, PROBE_HEAD_TIMEOUT_S, connection_limits
from service.main import create_app
from tests.service.live_server import live_server

LIMIT = 3
"""`CDT_HTTP_MAX_CONNECTIONS` of the test server."""
LIVEZ = b"GET /livez HTTP/1.1\r\nHost: test\r\n\r\n"
READYZ = b"GET /readyz HTTP/1.1\r\nHost: test\r\n\r\n"
MODELS = b"GET /v1/models HTTP/1.1\r\nHost: test\r\n\r\n"


@contextmanager
def saturated_server(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """Serve the app with `LIMIT` connections, all held by websockets that send nothing (the
    default idle timeout outlasts the test); yields the port."""
    monkeypatch.setenv("CDT_HTTP_MAX_CONNECTIONS", str(LIMIT))
    connection_limits.cache_clear()
    try:
        with live_server(create_app(settings)) as port, contextlib.ExitStack() as held:
            for _ in range(LIMIT):
                held.enter_context(connect(f"ws://127.0.0.1:{port}/v1/stream", open_timeout=10))
            yield port
    finally:
        connection_limits.cache_clear()


def exchange(port: int, data: bytes) -> bytes:
    """Everything the server sends back to `data` until it closes the connection (a socket
    timeout, when it keeps it open)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        connection.sendall(data)
        return read_until_closed(connection)


def read_until_closed(connection: socket.socket) -> bytes:
    answer = b""
    while chunk := connection.recv(65536):
        answer += chunk
    return answer


def assert_refused(answer: bytes) -> None:
    assert answer.startswith(b"HTTP/1.1 503 "), answer
    assert b'"code": "too_many_connections"' in answer


def test_livez_answers_while_the_connection_limit_is_reached(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    with saturated_server(settings, monkeypatch) as port:
        probe = exchange(port, LIVEZ + MODELS)  # a pipelined request must not ride along
        assert probe.startswith(b"HTTP/1.1 200 OK"), probe
        assert b"connection: close" in probe.lower()
        assert probe.count(b"HTTP/1.1 ") == 1  # one answer, then closed
        assert_refused(exchange(port, READYZ))  # a saturated replica is not ready
        assert_refused(exchange(port, MODELS))
        with pytest.raises(InvalidStatus) as refused:
            connect(f"ws://127.0.0.1:{port}/v1/stream", open_timeout=10)
        assert refused.value.response.status_code == 503


def test_connections_past_the_probe_allowance_are_refused_unread(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    with saturated_server(settings, monkeypatch) as port:
        silent = [
            socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(PROBE_ALLOWANCE)
        ]
        began = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as extra:
                assert_refused(read_until_closed(extra))  # sent nothing: refused unread
                assert time.monotonic() - began < PROBE_HEAD_TIMEOUT_S / 2
            for connection in silent:  # no head in time: the allowance frees itself
                assert_refused(read_until_closed(connection))
            assert time.monotonic() - began < PROBE_HEAD_TIMEOUT_S + 1.0
        finally:
            for connection in silent:
                connection.close()
        assert exchange(port, LIVEZ).startswith(b"HTTP/1.1 200 OK")
