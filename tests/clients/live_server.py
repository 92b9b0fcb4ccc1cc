"""A real uvicorn server in a thread, for tests that need sockets (websockets, timeouts)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

from service.config import Settings
from service.main import create_app

TOKEN = "client-token"
"""The bearer token the secured test servers require."""


def serve_in_thread(settings: Settings) -> Iterator[str]:
    """Run uvicorn on a free 127.0.0.1 port in a daemon thread; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(settings), log_level="warning", ws="websockets-sansio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10.0)
    sock.close()
