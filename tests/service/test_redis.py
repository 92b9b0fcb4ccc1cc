"""Several app instances over one Redis serve an episode interchangeably."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app
from tests.service.toy_policy import REDIS_URL, write_test_policy

pytestmark = pytest.mark.redis

OBSERVATIONS = [[0.1 * t, -0.2, 0.3 + 0.05 * t] for t in range(8)]
START = {"model": "toy", "target_reward": 50.0, "target_cost": 10.0, "seed": 11}


def step_body(t: int) -> dict[str, Any]:
    return {"observation": OBSERVATIONS[t], "reward": 1.0, "cost": 0.5, "step": t}


def run_on(clients: list[TestClient]) -> list[list[float]]:
    """One episode whose calls rotate over `clients`."""
    started = clients[0].post("/v1/episodes", json=START | {"observation": OBSERVATIONS[0]})
    episode_id, actions = started.json()["episode_id"], [started.json()["action"]]
    for t in range(1, len(OBSERVATIONS)):
        client = clients[t % len(clients)]
        reply = client.post(f"/v1/episodes/{episode_id}/step", json=step_body(t))
        assert reply.status_code == 200, reply.text
        actions.append(reply.json()["action"])
    return actions


def test_redis_episode_alternating_instances_matches_one_instance(
    redis_settings: Settings,
) -> None:
    with (
        TestClient(create_app(redis_settings)) as first,
        TestClient(create_app(redis_settings)) as second,
    ):
        assert run_on([first, second]) == run_on([first])


def test_redis_episode_survives_an_app_restart(redis_settings: Settings) -> None:
    with TestClient(create_app(redis_settings)) as client:
        started = client.post("/v1/episodes", json=START | {"observation": OBSERVATIONS[0]})
        episode_id = started.json()["episode_id"]
        client.post(f"/v1/episodes/{episode_id}/step", json=step_body(1))
    with TestClient(create_app(redis_settings)) as restarted:
        reply = restarted.post(f"/v1/episodes/{episode_id}/step", json=step_body(2))
        assert reply.status_code == 200 and reply.json()["step"] == 2
        state = restarted.get(f"/v1/episodes/{episode_id}").json()
        assert (state["total_reward"], state["total_cost"]) == (2.0, 1.0)


def test_a_replica_without_the_episodes_version_answers_a_retryable_503(
    redis_settings: Settings, tmp_path: Path
) -> None:
    """A deploy rolling out: the episode started on a replica serving version 2; one still on
    version 1 cannot step it, and says so as a retry elsewhere, not as an episode gone."""
    newer = tmp_path / "newer"
    write_test_policy(newer / "toy", version="2")
    with (
        TestClient(create_app(redis_settings.model_copy(update={"models_dir": newer}))) as new,
        TestClient(create_app(redis_settings)) as old,
    ):
        started = new.post("/v1/episodes", json=START | {"observation": OBSERVATIONS[0]})
        path = f"/v1/episodes/{started.json()['episode_id']}/step"
        refused = old.post(path, json=step_body(1))
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "model_version_unavailable"
        assert refused.headers["retry-after"] == "1"
        assert new.post(path, json=step_body(1)).json()["step"] == 1  # nothing was changed


def test_redis_retry_on_another_instance_returns_the_same_action(
    redis_settings: Settings,
) -> None:
    with (
        TestClient(create_app(redis_settings)) as first,
        TestClient(create_app(redis_settings)) as second,
    ):
        started = first.post("/v1/episodes", json=START | {"observation": OBSERVATIONS[0]})
        path = f"/v1/episodes/{started.json()['episode_id']}/step"
        reply = first.post(path, json=step_body(1)).json()
        assert second.post(path, json=step_body(1)).json() == reply


def test_redis_ended_episode_is_gone_on_every_instance(redis_settings: Settings) -> None:
    with (
        TestClient(create_app(redis_settings)) as first,
        TestClient(create_app(redis_settings)) as second,
    ):
        started = first.post("/v1/episodes", json=START | {"observation": OBSERVATIONS[0]})
        episode_id = started.json()["episode_id"]
        assert second.delete(f"/v1/episodes/{episode_id}").status_code == 200
        assert first.get(f"/v1/episodes/{episode_id}").status_code == 410
        assert second.get("/readyz").status_code == 200


def test_redis_record_of_another_format_fails_clearly_and_stays(
    redis_settings: Settings,
) -> None:
    import redis

    with TestClient(create_app(redis_settings)) as client:
        started = client.post("/v1/episodes", json=START | {"observation": OBSERVATIONS[0]})
        episode_id = started.json()["episode_id"]
        key = f"{redis_settings.redis_prefix}:episode:{episode_id}"
        with redis.Redis.from_url(REDIS_URL) as connection:
            old = b'{"episode_id": "' + episode_id.encode() + b'"}'  # an older replica's JSON
            connection.hset(key, "data", old)
            reply = client.post(f"/v1/episodes/{episode_id}/step", json=step_body(1))
            assert reply.status_code == 500 and reply.json()["code"] == "record_format"
            assert "this replica reads format" in reply.json()["detail"]
            assert connection.hget(key, "data") == old  # nothing written, the lock released
            again = client.post(f"/v1/episodes/{episode_id}/step", json=step_body(1))
            assert again.json()["code"] == "record_format"


def test_redis_unreachable_store_returns_503(settings: Settings) -> None:
    down = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    with TestClient(create_app(down)) as client:
        assert client.get("/readyz").status_code == 503
        response = client.post("/v1/episodes", json=START | {"observation": OBSERVATIONS[0]})
        assert response.status_code == 503 and response.json()["code"] == "store_unavailable"
        assert "127.0.0.1" not in response.text and "retry-after" in response.headers


def test_redis_hung_server_answers_503_fast_without_its_address(settings: Settings) -> None:
    with socket.create_server(("127.0.0.1", 0)) as hung:  # accepts connections, never answers
        port = hung.getsockname()[1]
        stuck = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{port}/0"})
        with TestClient(create_app(stuck)) as client:
            body = START | {"observation": OBSERVATIONS[0]}
            began = time.monotonic()
            first = client.post("/v1/episodes", json=body)
            assert time.monotonic() - began < 3.0  # the default socket timeout, not minutes
            replies = [first] + [client.post("/v1/episodes", json=body) for _ in range(4)]
            assert client.get("/readyz").status_code == 503
    for reply in replies:
        assert reply.status_code == 503 and reply.json()["code"] == "store_unavailable"
        assert "127.0.0.1" not in reply.text and str(port) not in reply.text
        assert int(reply.headers["retry-after"]) >= 1
    assert "retry in" in replies[-1].json()["detail"]  # the breaker answered without Redis
