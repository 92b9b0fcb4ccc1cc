"""Health, metrics, OpenAPI and bearer-token auth on REST and websocket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from service.config import Settings
from service.main import create_app
from service.routes.health import not_ready_retry_after
from tests.service.toy_policy import write_test_policy

TOKEN = "s3cret"


@pytest.fixture
def secured(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings.model_copy(update={"api_tokens": {TOKEN}}))) as client:
        yield client


def test_livez_and_readyz_are_ok_with_a_model(client: TestClient) -> None:
    assert client.get("/livez").json()["status"] == "ok"
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"] == 1


def test_readyz_without_models_returns_503_with_retry_after(
    settings: Settings, tmp_path: Path
) -> None:
    empty = {"models_dir": tmp_path / "empty", "not_ready_retry_after_s": 7}
    with TestClient(create_app(settings.model_copy(update=empty))) as client:
        assert client.get("/livez").status_code == 200
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.json()["detail"] == "no model loaded"
        assert ready.headers["retry-after"] == "7"


def test_readyz_ready_has_no_retry_after(client: TestClient) -> None:
    assert "retry-after" not in client.get("/readyz").headers


def test_readyz_with_the_store_breaker_open_retries_after_its_cooldown(
    settings: Settings,
) -> None:
    down = {"redis_url": "redis://127.0.0.1:1/0", "redis_breaker_failures": 1}
    down |= {"redis_breaker_cooldown_s": 30.0, "not_ready_retry_after_s": 7}
    with TestClient(create_app(settings.model_copy(update=down))) as client:
        ready = client.get("/readyz")  # its ping fails and trips the breaker
    assert ready.status_code == 503 and ready.json()["detail"] == "session store unavailable"
    assert ready.headers["retry-after"] == "30"


@pytest.mark.parametrize(
    ("models_ok", "store_wait_s", "expected"),
    [(True, 29.2, 30), (True, 0.0, 7), (False, 0.0, 7), (False, 2.5, 7), (False, 12.0, 12)],
)
def test_not_ready_retry_after_waits_for_the_breaker_or_the_setting(
    settings: Settings, models_ok: bool, store_wait_s: float, expected: int
) -> None:
    fixed = settings.model_copy(update={"not_ready_retry_after_s": 7})
    assert not_ready_retry_after(models_ok, store_wait_s, fixed) == expected


def test_readyz_reports_a_corrupt_model_file_in_the_repository(
    settings: Settings, models_dir: Path
) -> None:
    write_test_policy(models_dir / "broken", name="broken")
    (models_dir / "broken" / "model.onnx").write_bytes(b"not a graph")
    with TestClient(create_app(settings)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503
        body = ready.json()
        assert body["models"] == 1 and body["detail"] == "1 model folder(s) refused: broken"
        (refused,) = body["refused"]
        assert refused["path"] == "broken" and "model.onnx" in refused["error"]
        assert str(models_dir) not in refused["error"]  # no server paths without a token
        assert ready.headers["retry-after"] == str(settings.not_ready_retry_after_s)


def test_metrics_exposes_latency_batches_episodes_and_errors(client: TestClient) -> None:
    body = {"model": "toy", "target_reward": 1.0, "target_cost": 1.0, "observation": [0, 0, 0]}
    client.post("/v1/episodes", json=body)
    client.post("/v1/episodes", json=body | {"model": "nope"})
    text = client.get("/metrics").text
    assert 'cdt_step_latency_seconds_count{kind="start",transport="rest"} 1.0' in text
    assert "cdt_batch_size_count 1.0" in text
    assert "cdt_active_episodes 1.0" in text
    assert 'cdt_errors_total{kind="model_not_found"} 1.0' in text


def test_openapi_documents_the_v1_routes_with_tight_schemas(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert {"/v1/episodes", "/v1/episodes/{episode_id}/step", "/v1/models"} <= set(schema["paths"])
    observation = schema["components"]["schemas"]["StepRequest"]["properties"]["observation"]
    assert observation["maxItems"] == 4096
    assert "422" in schema["paths"]["/v1/episodes"]["post"]["responses"]
    assert client.get("/docs").status_code == 200


def test_openapi_documents_retry_after_where_it_is_sent(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    create = paths["/v1/episodes"]["post"]["responses"]
    step = paths["/v1/episodes/{episode_id}/step"]["post"]["responses"]
    ready = paths["/readyz"]["get"]["responses"]
    for response in (create["429"], create["503"], step["409"], ready["503"]):
        assert response["headers"]["Retry-After"]["schema"]["type"] == "integer"
    assert "headers" not in create["422"] and "headers" not in step["404"]


def test_unknown_route_returns_json_404(client: TestClient) -> None:
    response = client.get("/v2/nothing")
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_auth_missing_token_returns_401(secured: TestClient) -> None:
    response = secured.get("/v1/models")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    wrong = secured.get("/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401


def test_auth_valid_token_is_accepted(secured: TestClient) -> None:
    response = secured.get("/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200


def test_auth_health_endpoints_stay_open(secured: TestClient) -> None:
    assert secured.get("/livez").status_code == 200
    assert secured.get("/readyz").status_code == 200
    assert secured.get("/metrics").status_code == 401  # unless CDT_PUBLIC_METRICS


def test_auth_websocket_without_token_closes_1008(secured: TestClient) -> None:
    with secured.websocket_connect("/v1/stream") as ws, pytest.raises(WebSocketDisconnect) as exc:
        ws.receive_json()
    assert exc.value.code == 1008


def test_auth_websocket_with_token_header_or_query_is_accepted(secured: TestClient) -> None:
    frame = {"type": "end", "episode_id": "nope"}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with secured.websocket_connect("/v1/stream", headers=headers) as ws:
        ws.send_json(frame)
        assert ws.receive_json()["status"] == 404
    with secured.websocket_connect(f"/v1/stream?token={TOKEN}") as ws:
        ws.send_json(frame)
        assert ws.receive_json()["status"] == 404
