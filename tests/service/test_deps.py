"""Tenancy: each token is a principal that sees only its own episodes; admin-only routes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app

START = {"model": "toy", "target_reward": 50.0, "target_cost": 10.0, "observation": [0.1, 0.2, 0.3]}
STEP = {"observation": [0.1, 0.2, 0.3], "reward": 1.0, "cost": 0.5}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def tenants(models_dir: Path) -> Iterator[TestClient]:
    """Tokens alice and bob, and the admin token ops, read as the environment would give them."""
    settings = Settings(
        _env_file=None, models_dir=models_dir, api_tokens="alice, bob", admin_tokens="ops"
    )
    with TestClient(create_app(settings)) as client:
        yield client


def test_settings_admin_tokens_are_api_tokens_too() -> None:
    settings = Settings(_env_file=None, api_tokens="alice,bob", admin_tokens="ops")
    assert settings.api_tokens == {"alice", "bob", "ops"}
    assert settings.admin_tokens == {"ops"}


def test_token_sees_only_its_own_episodes(tenants: TestClient) -> None:
    started = tenants.post("/v1/episodes", json=START, headers=bearer("alice")).json()
    path = f"/v1/episodes/{started['episode_id']}"
    attempts = [
        ("GET", path, None),
        ("POST", f"{path}/step", STEP),
        ("PATCH", f"{path}/budget", {"cost_limit": 0.0}),
        ("DELETE", path, None),
    ]
    for method, url, body in attempts:
        response = tenants.request(method, url, json=body, headers=bearer("bob"))
        assert response.status_code == 404, (method, response.text)
        assert response.json()["code"] == "episode_not_found"
    state = tenants.get(path, headers=bearer("alice")).json()
    assert (state["step"], state["remaining_cost"]) == (0, 10.0)  # bob changed nothing
    assert tenants.delete(path, headers=bearer("alice")).status_code == 200
    assert tenants.get(path, headers=bearer("alice")).status_code == 410
    assert tenants.get(path, headers=bearer("bob")).status_code == 404  # not even its end


def test_token_sees_only_its_own_episodes_on_the_websocket(tenants: TestClient) -> None:
    started = tenants.post("/v1/episodes", json=START, headers=bearer("alice")).json()
    frame = STEP | {"type": "step", "episode_id": started["episode_id"]}
    with tenants.websocket_connect("/v1/stream?token=bob") as ws:
        ws.send_json(frame)
        assert ws.receive_json()["status"] == 404
    with tenants.websocket_connect("/v1/stream?token=alice") as ws:
        ws.send_json(frame)
        assert ws.receive_json()["step"] == 1


def test_admin_reload_needs_an_admin_token(tenants: TestClient) -> None:
    refused = tenants.post("/v1/admin/reload", headers=bearer("alice"))
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    assert tenants.post("/v1/admin/reload").status_code == 401
    assert tenants.post("/v1/admin/reload", headers=bearer("ops")).status_code == 200


def test_admin_token_runs_episodes_of_its_own(tenants: TestClient) -> None:
    assert tenants.post("/v1/episodes", json=START, headers=bearer("ops")).status_code == 201


def test_without_tokens_everyone_shares_the_episodes_and_may_reload(client: TestClient) -> None:
    started = client.post("/v1/episodes", json=START, headers=bearer("anything")).json()
    assert client.get(f"/v1/episodes/{started['episode_id']}").status_code == 200
    assert client.post("/v1/admin/reload").status_code == 200
