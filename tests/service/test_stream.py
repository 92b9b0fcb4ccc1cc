"""`WS /v1/stream`: several episodes over one socket, frame validation and close codes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from service.config import Settings
from service.episodes import EpisodeService
from service.errors import (
    EpisodeNotFoundError,
    ServiceError,
    StepOutOfOrderError,
    StoreUnavailableError,
    TooManyEpisodesError,
)
from service.locks import episode_busy
from service.main import create_app

OBSERVATION = [0.1, -0.2, 0.3]
START = {
    "type": "start",
    "model": "toy",
    "target_reward": 50.0,
    "target_cost": 10.0,
    "observation": OBSERVATION,
    "seed": 4,
}
REST_START = {name: value for name, value in START.items() if name != "type"}


def test_stream_runs_an_episode_from_start_to_end(client: TestClient) -> None:
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_json(START | {"request_id": "r1"})
        started = ws.receive_json()
        assert started["type"] == "action" and started["request_id"] == "r1"
        episode_id = started["episode_id"]
        ws.send_json(
            {"type": "step", "episode_id": episode_id, "observation": OBSERVATION,
             "reward": 1.0, "cost": 2.0, "request_id": "r2"}
        )  # fmt: skip
        stepped = ws.receive_json()
        assert (stepped["step"], stepped["remaining_cost"]) == (1, 8.0)
        ws.send_json({"type": "budget", "episode_id": episode_id, "cost_limit": 4.0})
        state = ws.receive_json()
        assert state["type"] == "state" and state["remaining_cost"] == 2.0
        ws.send_json({"type": "end", "episode_id": episode_id})
        ended = ws.receive_json()
        assert ended["type"] == "ended" and ended["total_cost"] == 2.0


def test_stream_matches_rest_actions_for_the_same_seed(client: TestClient) -> None:
    rest = client.post("/v1/episodes", json={k: v for k, v in START.items() if k != "type"})
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_json(START)
        assert ws.receive_json()["action"] == rest.json()["action"]


def test_stream_carries_several_episodes_on_one_socket(client: TestClient) -> None:
    with client.websocket_connect("/v1/stream") as ws:
        ids = []
        for seed in (1, 2):
            ws.send_json(START | {"seed": seed})
            ids.append(ws.receive_json()["episode_id"])
        for episode_id in ids:
            ws.send_json(
                {"type": "step", "episode_id": episode_id, "observation": OBSERVATION,
                 "reward": 0.0, "cost": 0.0}
            )  # fmt: skip
            reply = ws.receive_json()
            assert reply["episode_id"] == episode_id and reply["step"] == 1


def test_stream_unknown_episode_answers_error_and_stays_open(client: TestClient) -> None:
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_json({"type": "end", "episode_id": "nope", "request_id": "x"})
        error = ws.receive_json()
        assert (error["type"], error["status"], error["request_id"]) == ("error", 404, "x")
        assert error["episode_id"] == "nope"
        ws.send_json(START)
        assert ws.receive_json()["type"] == "action"


def test_stream_wrong_observation_length_answers_422_error(client: TestClient) -> None:
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_json(START | {"observation": [1.0]})
        error = ws.receive_json()
        assert (error["status"], error["field"]) == (422, "observation")


@pytest.mark.parametrize(
    "frame",
    [
        "not json",
        '{"type": "dance"}',
        '{"type": "step", "episode_id": "a", "observation": [NaN], "reward": 0, "cost": 0}',
        '{"type": "start"}',
    ],
)
def test_stream_invalid_frame_answers_error_and_stays_open(client: TestClient, frame: str) -> None:
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_text(frame)
        error = ws.receive_json()
        assert (error["type"], error["status"], error["code"]) == ("error", 422, "validation_error")
        ws.send_json(START)
        assert ws.receive_json()["type"] == "action"


def test_stream_invalid_frame_keeps_the_other_episodes_and_echoes_its_ids(
    client: TestClient,
) -> None:
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_json(START)
        episode_id = ws.receive_json()["episode_id"]
        ws.send_json(
            {"type": "step", "episode_id": "other", "observation": OBSERVATION,
             "reward": 0.0, "cost": -1.0, "request_id": "bad-1"}
        )  # fmt: skip
        error = ws.receive_json()
        assert (error["status"], error["field"]) == (422, "cost")
        assert (error["request_id"], error["episode_id"]) == ("bad-1", "other")
        ws.send_json(
            {"type": "step", "episode_id": episode_id, "observation": OBSERVATION,
             "reward": 0.0, "cost": 0.0, "request_id": "good"}
        )  # fmt: skip
        stepped = ws.receive_json()
        assert (stepped["type"], stepped["request_id"], stepped["step"]) == ("action", "good", 1)


@pytest.mark.parametrize(
    "frame", ["not json", "[1, 2]", '{"type": "end", "request_id": 7, "episode_id": ["x"]}']
)
def test_stream_error_frame_omits_ids_it_cannot_read(client: TestClient, frame: str) -> None:
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_text(frame)
        error = ws.receive_json()
        assert error["status"] == 422
        assert (error["request_id"], error["episode_id"]) == (None, None)


def test_stream_run_of_invalid_frames_closes_1008(settings: Settings) -> None:
    strict = settings.model_copy(update={"ws_max_invalid_frames": 3})
    with TestClient(create_app(strict)) as client, client.websocket_connect("/v1/stream") as ws:
        for frame in ("bad", "bad", START, "bad", "bad"):  # a good frame ends the run
            ws.send_text(frame if isinstance(frame, str) else json.dumps(frame))
            assert ws.receive_json()["type"] == ("action" if frame is START else "error")
        ws.send_text("bad")
        assert ws.receive_json()["status"] == 422
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1008


def test_stream_invalid_frame_names_the_field(client: TestClient) -> None:
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_json(START | {"target_cost": -1.0})
        assert ws.receive_json()["field"] == "target_cost"


def test_stream_binary_frame_is_accepted(client: TestClient) -> None:
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_bytes(b'{"type": "end", "episode_id": "nope"}')
        assert ws.receive_json()["status"] == 404


def test_stream_oversized_frame_closes_1009(settings: Settings) -> None:
    small = settings.model_copy(update={"max_body_bytes": 1024})
    with TestClient(create_app(small)) as client, client.websocket_connect("/v1/stream") as ws:
        ws.send_json(START | {"observation": [0.5] * 1000})
        assert ws.receive_json()["status"] == 413
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1009


def test_stream_internal_error_closes_1011(client: TestClient, monkeypatch: Any) -> None:
    def explode(*_: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("service.routes.stream.dispatch", explode)
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_json(START)
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1011


@pytest.mark.parametrize(
    ("refusal", "retry_after"),
    [
        (episode_busy("e1", 2.0), 1),
        (TooManyEpisodesError("full"), 1),
        (StoreUnavailableError("breaker open", retry_after=7), 7),
        (EpisodeNotFoundError("no episode", "episode_id"), None),
        (StepOutOfOrderError("expected step 2", "step"), None),
    ],
)
def test_stream_error_frame_carries_retry_after_only_when_retrying_helps(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, refusal: ServiceError, retry_after: Any
) -> None:
    async def refuse(*_: Any) -> Any:
        raise refusal

    monkeypatch.setattr(EpisodeService, "end", refuse)
    with client.websocket_connect("/v1/stream") as ws:
        ws.send_json({"type": "end", "episode_id": "e1"})
        error = ws.receive_json()
    assert (error["type"], error["code"]) == ("error", refusal.code)
    assert "retry_after" in error and error["retry_after"] == retry_after


def test_stream_quota_error_frame_has_the_rest_retry_after(settings: Settings) -> None:
    quota = {"api_tokens": frozenset({"a"}), "max_episodes_per_token": 1}
    headers = {"Authorization": "Bearer a"}
    with TestClient(create_app(settings.model_copy(update=quota))) as client:
        with client.websocket_connect("/v1/stream", headers=headers) as ws:
            ws.send_json(START)
            assert ws.receive_json()["type"] == "action"
            ws.send_json(START)
            error = ws.receive_json()
        rest = client.post("/v1/episodes", json=REST_START, headers=headers)
    assert (error["status"], error["code"]) == (429, "episode_quota_exceeded")
    assert rest.status_code == 429 and error["retry_after"] == int(rest.headers["retry-after"])


def test_stream_store_unavailable_frame_has_retry_after(settings: Settings) -> None:
    down = {"redis_url": "redis://127.0.0.1:1/0", "redis_breaker_failures": 1}
    down |= {"redis_breaker_cooldown_s": 30.0}
    with TestClient(create_app(settings.model_copy(update=down))) as client:
        with client.websocket_connect("/v1/stream") as ws:
            errors = []
            for _ in range(2):  # the first failure trips the breaker, the second meets it
                ws.send_json(START)
                errors.append(ws.receive_json())
        rest = client.post("/v1/episodes", json=REST_START)
    assert [error["status"] for error in errors] == [503, 503]
    # the tripped breaker's probe lets calls through as soon as Redis answers: 1 s, not 30
    assert errors[0]["retry_after"] == 1 and errors[1]["retry_after"] == 1
    assert rest.headers["retry-after"] == "1"
