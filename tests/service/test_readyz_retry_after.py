"""`/readyz`'s `Retry-After` when the session store is all that is wrong: the breaker's remaining
cool-down once it opened, one probe interval (rounded up) before that, not the not-ready setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app

UNREACHABLE = "redis://127.0.0.1:1/0"


@pytest.mark.parametrize(("probe_interval_s", "expected"), [(0.1, "1"), (1.5, "2")])
def test_readyz_with_the_store_down_before_the_breaker_opens_retries_after_a_probe_interval(
    settings: Settings, probe_interval_s: float, expected: str
) -> None:
    down = {"redis_url": UNREACHABLE, "redis_breaker_failures": 100}
    down |= {"redis_probe_interval_s": probe_interval_s, "not_ready_retry_after_s": 7}
    app = create_app(settings.model_copy(update=down))
    with TestClient(app) as client:
        ready = client.get("/readyz")  # its ping fails; the breaker stays closed
        assert app.state.service.store.unavailable_for() == 0
    assert ready.status_code == 503 and ready.json()["detail"] == "session store unavailable"
    assert ready.headers["retry-after"] == expected


def test_readyz_with_the_store_and_the_models_down_retries_after_the_setting(
    settings: Settings, tmp_path: Path
) -> None:
    down = {"redis_url": UNREACHABLE, "redis_breaker_failures": 100}
    down |= {"models_dir": tmp_path / "empty", "not_ready_retry_after_s": 7}
    with TestClient(create_app(settings.model_copy(update=down))) as client:
        ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.headers["retry-after"] == "7"
