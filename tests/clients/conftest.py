"""Client fixtures: the test policy, an in-process app, and a real uvicorn server in a thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app
from tests.clients.live_server import TOKEN, serve_in_thread
from tests.service.toy_policy import write_test_policy


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


@pytest.fixture(scope="module")
def live_url(client_settings: Settings) -> Iterator[str]:
    """A real server for the websocket and async clients."""
    yield from serve_in_thread(client_settings)


@pytest.fixture(scope="module")
def secured_url(client_settings: Settings) -> Iterator[str]:
    """A real server that requires the bearer token `TOKEN`."""
    yield from serve_in_thread(client_settings.model_copy(update={"api_tokens": {TOKEN}}))


@pytest.fixture(scope="module")
def quota_url(client_settings: Settings) -> Iterator[str]:
    """A real server that holds one live episode per token (`TOKEN`): a second start gets 429
    with `Retry-After` the time until the held episode expires (about 1 s with this TTL)."""
    quota = {"api_tokens": {TOKEN}, "max_episodes_per_token": 1, "episode_ttl_s": 1.0}
    yield from serve_in_thread(client_settings.model_copy(update=quota))
