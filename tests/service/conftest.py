"""Service fixtures: a tiny ONNX policy built with `onnx.helper` (no torch) and an app client."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient  # quiet: tests/conftest.py imported it first

from service.config import Settings
from service.main import create_app
from tests.service.toy_policy import REDIS_URL, write_test_policy


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    """A model repository holding the `toy` policy."""
    write_test_policy(tmp_path / "models" / "toy")
    return tmp_path / "models"


@pytest.fixture
def settings(models_dir: Path) -> Settings:
    """Settings isolated from the environment and `.env`."""
    return Settings(_env_file=None, models_dir=models_dir, redis_url=None, api_tokens=frozenset())


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """A client of a started app (the `with` runs the lifespan)."""
    with TestClient(create_app(settings)) as test_client:
        yield test_client


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A unique Redis key prefix, deleted after the test; skips when Redis is not running."""
    import redis

    connection = redis.Redis.from_url(REDIS_URL)
    try:
        connection.ping()
    except redis.RedisError:
        pytest.skip(f"no Redis at {REDIS_URL}")
    prefix = f"cdt-test-{uuid.uuid4().hex}"
    yield prefix
    keys = list(connection.scan_iter(f"{prefix}:*"))
    if keys:
        connection.delete(*keys)
    connection.close()


@pytest.fixture
def redis_settings(settings: Settings, redis_prefix: str) -> Settings:
    """Settings with the Redis session store under a unique prefix."""
    return settings.model_copy(update={"redis_url": REDIS_URL, "redis_prefix": redis_prefix})
