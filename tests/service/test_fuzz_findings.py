"""What `bench/fuzz_api.py` found: bodies FastAPI could not read answered 400 `http_error` "There
was an error parsing the body", malformed JSON named a character offset as its field, a JSON
object sent without its content type was called "not a valid dictionary", unknown routes and
methods said only "Not Found" / "Method Not Allowed" (with an empty `Allow`), and a websocket
counted episodes ended over REST against its episode limit for ever."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app

START = {"model": "toy", "target_reward": 10.0, "target_cost": 5.0, "observation": [0.1, 0.2, 0.3]}
JSON = {"content-type": "application/json"}


def refusal(response: Any) -> tuple[int, str, str | None, str]:
    body = response.json()
    assert set(body) == {"code", "detail", "field"}
    return response.status_code, body["code"], body["field"], body["detail"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b'{"model": "\xff\xfe"}', "not UTF-8 text (byte 0xff at 11)"),
        (b"[" * 50_000 + b"]" * 50_000, "nested too deep"),
        (b'{"model": "toy", "seed": ' + b"1" * 5000 + b"}", "more digits"),
    ],
)
def test_a_body_the_json_reader_raises_on_is_a_422_naming_why(
    client: TestClient, content: bytes, words: str
) -> None:
    status, code, field, detail = refusal(
        client.post("/v1/episodes", content=content, headers=JSON)
    )
    assert (status, code, field) == (422, "validation_error", "body")  # was 400 http_error
    assert words in detail


def test_malformed_json_names_the_body_and_the_parser_s_reason(client: TestClient) -> None:
    answer = client.post("/v1/episodes", content=b'{"model": "toy",', headers=JSON)
    status, code, field, detail = refusal(answer)
    assert (status, code, field) == (422, "validation_error", "body")  # the field was "16"
    assert detail.startswith("body: not valid JSON: Expecting property name") and "16" in detail


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_json_object_without_its_content_type_is_told_to_send_one(
    client: TestClient, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    answer = client.post("/v1/episodes", content=b'{"model": "toy"}', headers=headers)
    status, code, field, detail = refusal(answer)
    assert (status, code, field) == (422, "validation_error", "body")
    assert "Content-Type: application/json" in detail and "dictionary" not in detail
    assert repr(content_type) in detail if content_type else "content type: none" in detail


@pytest.mark.parametrize(
    ("content", "kind"), [(b"[1, 2]", "an array"), (b"7", "a number"), (b"null", "null")]
)
def test_a_body_that_is_not_an_object_says_what_it_is(
    client: TestClient, content: bytes, kind: str
) -> None:
    status, code, field, detail = refusal(
        client.post("/v1/episodes", content=content, headers=JSON)
    )
    assert (status, code, field) == (422, "validation_error", "body")
    assert detail == f"body: must be a JSON object, got {kind}"


def test_an_empty_body_and_an_empty_key_name_the_body_and_no_value_error_prefix(
    client: TestClient,
) -> None:
    assert refusal(client.post("/v1/episodes", content=b"", headers=JSON))[2:] == (
        "body",
        "body: a JSON object is required",
    )
    assert refusal(client.post("/v1/episodes", json=START | {"": 1}))[2] == "body"  # was "frame"
    episode = client.post("/v1/episodes", json=START).json()["episode_id"]
    detail = refusal(client.patch(f"/v1/episodes/{episode}/budget", json={}))[3]
    assert detail == "body: give at least one of cost_limit, remaining_cost, target_reward"


def test_unknown_routes_and_methods_say_which_and_what_is_allowed(client: TestClient) -> None:
    status, code, _, detail = refusal(client.get("/v1/nope"))
    assert (status, code) == (404, "not_found")
    assert detail == "no route GET /v1/nope; the API's routes are listed at /docs"
    refused = client.put("/v1/models")
    status, code, _, detail = refusal(refused)
    assert (status, code) == (405, "method_not_allowed")
    assert detail == "PUT is not allowed on /v1/models; allowed: GET"
    assert refused.headers["allow"] == "GET"  # was empty: the routes are in included routers
    assert client.post("/v1/episodes/abc").headers["allow"] == "DELETE, GET"
    assert client.post("/livez").headers["allow"] == "GET"


def test_episodes_ended_over_rest_free_their_socket_s_places(settings: Settings) -> None:
    capped = settings.model_copy(update={"ws_max_episodes_per_socket": 2})
    start = {"type": "start", **START}
    with TestClient(create_app(capped)) as client, client.websocket_connect("/v1/stream") as ws:
        episodes = []
        for _ in range(2):
            ws.send_json(start)
            episodes.append(ws.receive_json()["episode_id"])
        ws.send_json(start)
        assert ws.receive_json()["code"] == "socket_episode_limit"
        assert client.delete(f"/v1/episodes/{episodes[0]}").status_code == 200
        ws.send_json(start)  # was 429 socket_episode_limit: the ended episode still counted
        assert ws.receive_json()["type"] == "action"
        ws.send_json(start)  # the live ones still count
        assert ws.receive_json()["code"] == "socket_episode_limit"
