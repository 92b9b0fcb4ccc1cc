"""Client fixtures: the test policy, an in-process app, and a real uvicorn server in a thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from service.config import Settings
from service.main import create_app
from tests.service.conftest import TestClient, write_test_policy

TOKEN = "client-token"


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio."""
    return "asyncio"


@pytest.fixture(scope="module")
def client_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Settings serving the `toy` test policy from a module-wide models directory."""
    models: Path = tmp_path_factory.mktemp("models")
    write_test_policy(models / "toy")
    return Settings(_env_file=None, models_dir=models, redis_url=None, api_tokens=frozenset())


@pytest.fixture
def app_client(client_settings: Settings) -> Iterator[TestClient]:
    """An in-process app (TestClient is an httpx.Client, so PolicyClient can drive it)."""
    with TestClient(create_app(client_settings)) as test_client:
        yield test_client


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


@pytest.fixture(scope="module")
def live_url(client_settings: Settings) -> Iterator[str]:
    """A real server for the websocket and async clients."""
    yield from serve_in_thread(client_settings)


@pytest.fixture(scope="module")
def secured_url(client_settings: Settings) -> Iterator[str]:
    """A real server that requires the bearer token `TOKEN`."""
    yield from serve_in_thread(client_settings.model_copy(update={"api_tokens": {TOKEN}}))
