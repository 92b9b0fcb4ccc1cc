"""The app at its edges (issue 30): what tokens close besides /v1, the store metrics, a step
index repeated with another observation, the per-socket episode cap, the quota's Retry-After."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app

TOKEN = "alice-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
START = {"model": "toy", "target_reward": 10.0, "target_cost": 5.0, "seed": 3}
OBSERVATION = [0.1, 0.2, 0.3]
GATED = ("/metrics", "/docs", "/redoc", "/openapi.json")


@pytest.fixture
def token_client(settings: Settings) -> Iterator[TestClient]:
    tokens = settings.model_copy(update={"api_tokens": frozenset({TOKEN})})
    with TestClient(create_app(tokens)) as client:
        yield client


def step(t: int, observation: list[float] | None = None) -> dict[str, Any]:
    return {
        "observation": observation or [0.1 * t, 0.0, 1.0],
        "reward": 1.0,
        "cost": 0.5,
        "step": t,
    }


@pytest.mark.parametrize("path", GATED)
def test_metrics_and_docs_need_a_token_when_tokens_are_set(
    token_client: TestClient, path: str
) -> None:
    refused = token_client.get(path)
    assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
    assert refused.headers["www-authenticate"] == "Bearer"
    assert token_client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert token_client.get(path, headers=AUTH).status_code == 200
    assert token_client.get("/livez").status_code == 200  # health stays open


def test_public_metrics_and_docs_settings_open_them_to_everyone(settings: Settings) -> None:
    public = {"api_tokens": frozenset({TOKEN}), "public_metrics": True, "public_docs": True}
    with TestClient(create_app(settings.model_copy(update=public))) as client:
        for path in GATED:
            assert client.get(path).status_code == 200, path
        assert client.get("/v1/models").status_code == 401  # the API stays closed


def test_metrics_and_docs_are_open_without_tokens(client: TestClient) -> None:
    for path in GATED:
        assert client.get(path).status_code == 200, path


@pytest.mark.redis
def test_metrics_report_the_store_breaker_and_round_trip_latency(
    redis_settings: Settings,
) -> None:
    with TestClient(create_app(redis_settings)) as client:
        started = client.post("/v1/episodes", json=START | {"observation": OBSERVATION})
        client.post(f"/v1/episodes/{started.json()['episode_id']}/step", json=step(1))
        metrics = client.get("/metrics").text
    assert "cdt_store_breaker_open 0.0" in metrics
    for operation in ("create", "claim", "commit"):
        assert f'cdt_store_latency_seconds_count{{operation="{operation}"}} 1.0' in metrics


def test_metrics_in_memory_show_a_closed_breaker_and_no_round_trips(client: TestClient) -> None:
    metrics = client.get("/metrics").text
    assert "cdt_store_breaker_open 0.0" in metrics
    assert "cdt_store_latency_seconds_count" not in metrics


def test_step_repeated_with_another_observation_is_a_conflict_and_changes_nothing(
    client: TestClient,
) -> None:
    started = client.post("/v1/episodes", json=START | {"observation": OBSERVATION})
    path = f"/v1/episodes/{started.json()['episode_id']}/step"
    first = client.post(path, json=step(1))
    assert client.post(path, json=step(1)).json() == first.json()  # a retry: the same action
    conflict = client.post(path, json=step(1, [9.0, 9.0, 9.0]))
    assert conflict.status_code == 409 and conflict.json()["code"] == "step_conflict"
    assert conflict.json()["field"] == "observation" and "retry-after" not in conflict.headers
    state = client.get(path.removesuffix("/step")).json()
    assert (state["step"], state["total_reward"]) == (1, 1.0)
    assert client.post(path, json=step(2)).json()["step"] == 2


@pytest.mark.parametrize(("field", "value"), [("reward", 7.0), ("cost", 3.0)])
def test_step_repeated_with_another_reward_or_cost_is_a_conflict_and_changes_nothing(
    client: TestClient, field: str, value: float
) -> None:
    """A retry whose numbers differ would be answered as if they had counted: refused."""
    started = client.post("/v1/episodes", json=START | {"observation": OBSERVATION})
    path = f"/v1/episodes/{started.json()['episode_id']}/step"
    first = client.post(path, json=step(1) | {"cost": 0.5})
    assert client.post(path, json=step(1) | {"cost": 0.5}).json() == first.json()
    conflict = client.post(path, json=step(1) | {"cost": 0.5, field: value})
    assert conflict.status_code == 409 and conflict.json()["code"] == "step_conflict"
    assert conflict.json()["field"] == field and "was taken with" in conflict.json()["detail"]
    state = client.get(path.removesuffix("/step")).json()
    assert (state["step"], state["total_reward"], state["total_cost"]) == (1, 1.0, 0.5)


def test_stream_step_repeated_with_another_observation_is_a_conflict(client: TestClient) -> None:
    with client.websocket_connect("/v1/stream") as websocket:
        websocket.send_json({"type": "start", **START, "observation": OBSERVATION})
        episode_id = websocket.receive_json()["episode_id"]
        websocket.send_json({"type": "step", "episode_id": episode_id, **step(1)})
        assert websocket.receive_json()["type"] == "action"
        other = {"type": "step", "episode_id": episode_id, **step(1, [5.0, 5.0, 5.0])}
        websocket.send_json(other)
        error = websocket.receive_json()
    assert (error["type"], error["status"], error["code"]) == ("error", 409, "step_conflict")
    assert error["retry_after"] is None


def test_stream_socket_starts_at_most_its_episode_limit(settings: Settings) -> None:
    capped = settings.model_copy(update={"ws_max_episodes_per_socket": 2})
    start = {"type": "start", **START, "observation": OBSERVATION}
    with TestClient(create_app(capped)) as client, client.websocket_connect("/v1/stream") as ws:
        episode_ids = []
        for _ in range(2):
            ws.send_json(start)
            episode_ids.append(ws.receive_json()["episode_id"])
        ws.send_json(start | {"request_id": "third"})
        refused = ws.receive_json()
        assert (refused["status"], refused["code"]) == (429, "socket_episode_limit")
        assert refused["request_id"] == "third" and refused["retry_after"] is None
        ws.send_json({"type": "end", "episode_id": episode_ids[0]})
        assert ws.receive_json()["type"] == "ended"
        ws.send_json(start)  # ending one frees a place
        assert ws.receive_json()["type"] == "action"
    with TestClient(create_app(capped)) as client, client.websocket_connect("/v1/stream") as ws:
        ws.send_json(start)  # the limit is per socket
        assert ws.receive_json()["type"] == "action"


def test_quota_refusal_retry_after_is_when_a_slot_frees_by_expiry(settings: Settings) -> None:
    quota = {"api_tokens": frozenset({TOKEN}), "max_episodes_per_token": 1}
    with TestClient(create_app(settings.model_copy(update=quota))) as client:
        body = START | {"observation": OBSERVATION}
        assert client.post("/v1/episodes", json=body, headers=AUTH).status_code == 201
        refused = client.post("/v1/episodes", json=body, headers=AUTH)
    assert refused.status_code == 429 and refused.json()["code"] == "episode_quota_exceeded"
    retry_after = int(refused.headers["retry-after"])
    assert settings.episode_ttl_s - 5 <= retry_after <= settings.episode_ttl_s
