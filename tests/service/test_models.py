"""`GET /v1/models`, reloads (admin endpoint and SIGHUP) and version pinning."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from tests.service.toy_policy import write_test_policy

OBSERVATION = [0.1, -0.2, 0.3]


def start(client: TestClient) -> dict[str, object]:
    body = {"model": "toy", "target_reward": 50, "target_cost": 10, "observation": OBSERVATION}
    result: dict[str, object] = client.post("/v1/episodes", json=body).json()
    return result


def test_list_models_shows_dims_bounds_and_validated_range(client: TestClient) -> None:
    (model,) = client.get("/v1/models").json()["models"]
    assert (model["name"], model["observation_dim"], model["context_len"]) == ("toy", 3, 4)
    assert model["validated_cost_range"] == [5.0, 40.0]
    assert model["action_low"] == [-1.0, -1.0]
    assert client.get("/v1/models/toy").json() == model
    assert client.get("/v1/models/nope").status_code == 404


def test_reload_pins_running_episodes_to_their_version(
    client: TestClient, models_dir: Path
) -> None:
    old = start(client)
    write_test_policy(models_dir / "toy", version="2")
    result = client.post("/v1/admin/reload").json()
    assert result["loaded"] == [{"name": "toy", "version": "2"}]
    assert start(client)["model_version"] == "2"
    body = {"observation": OBSERVATION, "reward": 0, "cost": 0}
    stepped = client.post(f"/v1/episodes/{old['episode_id']}/step", json=body).json()
    assert stepped["model_version"] == "1"


def test_reload_broken_file_is_refused_and_old_version_serves(
    client: TestClient, models_dir: Path
) -> None:
    write_test_policy(models_dir / "toy", version="2")
    (models_dir / "toy" / "model.onnx").write_bytes(b"garbage")
    response = client.post("/v1/admin/reload")
    assert response.status_code == 422
    result = response.json()
    assert result["code"] == "models_refused" and "toy" in result["detail"]
    assert result["failed"][0]["path"] == str(models_dir / "toy") and not result["loaded"]
    assert start(client)["model_version"] == "1"
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["refused"][0]["path"] == "toy"
    write_test_policy(models_dir / "toy", version="2")  # fixed: the next reload clears it
    assert client.post("/v1/admin/reload").status_code == 200
    assert client.get("/readyz").status_code == 200


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_sighup_reloads_the_repository(settings: Settings, models_dir: Path) -> None:
    import asyncio

    from service.main import _install_sighup
    from service.metrics import Metrics
    from service.repository import ModelRepository

    repository = ModelRepository(models_dir)
    repository.reload()
    write_test_policy(models_dir / "toy", version="2")

    async def main() -> None:
        uninstall = _install_sighup(repository, Metrics())
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(200):
            await asyncio.sleep(0.01)
            if repository.current("toy").card.version == "2":
                break
        uninstall()

    assert threading.current_thread() is threading.main_thread()
    started = time.monotonic()
    asyncio.run(main())
    assert repository.current("toy").card.version == "2", time.monotonic() - started
