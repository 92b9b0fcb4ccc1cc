"""The REST client and `cdt rollout` against a broken or hostile server (httpx.MockTransport):
what `bench/fuzz_clients.py` found. Every answer is valid data or a typed, one-line error, in
bounded time and memory, and `cdt rollout` keeps the episodes that finished."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from clients import rollout
from clients.answers import MAX_ANSWER_BYTES
from clients.client import (
    AsyncPolicyClient,
    PolicyClient,
    PolicyClientError,
    ServerError,
    ServiceUnreachableError,
)
from clients.errors import InvalidResponseError
from clients.retry import RetryPolicy
from tests.runtime.toy_env import ToyEnv

OBSERVATION = [0.1, 0.2, 0.3]
CARD = {
    "name": "toy", "version": "1", "task": "toy-task", "observation_dim": 3, "action_dim": 2,
    "action_low": [-1.0, -1.0], "action_high": [1.0, 1.0], "context_len": 4,
    "max_episode_len": 4, "default_targets": [{"reward": 10.0, "cost": 5.0}],
}  # fmt: skip
FAST = RetryPolicy(retries=2, max_wait_s=0.1, backoff_s=0.01)
Handler = Callable[[httpx.Request], httpx.Response]


def step_answer(episode_id: str = "ep-1", step: int = 1, **changes: Any) -> dict[str, Any]:
    answer = {"episode_id": episode_id, "action": [0.25, -0.5], "step": step,
              "remaining_reward": 5.0, "remaining_cost": 2.0, "budget_exhausted": False,
              "model": "toy", "model_version": "1"}  # fmt: skip
    return answer | changes


def summary_answer(episode_id: str) -> dict[str, Any]:
    return {"episode_id": episode_id, "model": "toy", "model_version": "1", "steps": 4,
            "total_reward": 1.0, "total_cost": 0.0, "remaining_reward": 1.0,
            "remaining_cost": 5.0, "budget_exhausted": False}  # fmt: skip


def client_for(handler: Handler, timeout: float = 2.0) -> PolicyClient:
    http = httpx.Client(transport=httpx.MockTransport(handler), timeout=timeout)
    return PolicyClient("http://policy", http_client=http, retry=FAST)


def answering(body: bytes | str | dict[str, Any], status: int = 200, **headers: str) -> Handler:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    raw = raw.encode() if isinstance(raw, str) else raw
    return lambda request: httpx.Response(status, stream=httpx.ByteStream(raw), headers=headers)


@pytest.mark.parametrize(
    "body",
    [
        b'{"episode_id": "ep-1", "act',
        b"<html>502 Bad Gateway</html>",
        b"",
        json.dumps({k: v for k, v in step_answer().items() if k != "action"}).encode(),
        json.dumps(step_answer(step="three")).encode(),
    ],
)
def test_a_malformed_answer_raises_invalid_response_not_a_validation_error(body: bytes) -> None:
    with client_for(answering(body)) as client, pytest.raises(InvalidResponseError) as raised:
        client.step("ep-1", OBSERVATION, 1.0, 0.0, step=1)
    assert "\n" not in str(raised.value) and "POST /v1/episodes/ep-1/step" in str(raised.value)


@pytest.mark.parametrize(
    "action", ["[NaN, 0.0]", "[Infinity, 0.0]", "[0.0, -Infinity]", "[1e999, 0]"]
)
def test_a_non_finite_action_is_never_returned(action: str) -> None:
    body = json.dumps(step_answer()).replace("[0.25, -0.5]", action)
    with client_for(answering(body)) as client, pytest.raises(InvalidResponseError, match="finite"):
        client.step("ep-1", OBSERVATION, 1.0, 0.0)


@pytest.mark.parametrize("action", [[0.1], [0.0, 0.0, 0.0], [1.5, 0.0], [0.0, -7.0]])
def test_an_action_off_the_card_is_refused_once_the_card_is_known(action: list[float]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"models": [CARD]})
        return httpx.Response(200, json=step_answer(action=action))

    with client_for(handler) as client:
        client.list_models()
        with pytest.raises(InvalidResponseError, match="toy"):
            client.step("ep-1", OBSERVATION, 1.0, 0.0, step=1)


def test_an_action_on_the_bounds_in_float32_is_accepted() -> None:
    card = CARD | {"action_low": [-0.3, -0.3], "action_high": [0.3, 0.3]}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"models": [card]})
        return httpx.Response(200, json=step_answer(action=[0.30000001192092896, -0.3]))

    with client_for(handler) as client:
        client.list_models()
        assert client.step("ep-1", OBSERVATION, 1.0, 0.0).action[0] == pytest.approx(0.3)


@pytest.mark.parametrize("call", ["step", "get", "close"])
def test_an_answer_about_another_episode_is_refused(call: str) -> None:
    other = step_answer("ep-999") | summary_answer("ep-999")
    other |= {"target_reward": 1.0, "target_cost": 1.0, "total_reward": 0.0, "total_cost": 0.0,
              "deterministic": False, "seed": 0, "created_at": 1.0, "expires_at": 2.0}  # fmt: skip
    with client_for(answering(other)) as client, pytest.raises(InvalidResponseError, match="999"):
        if call == "step":
            client.step("ep-1", OBSERVATION, 1.0, 0.0)
        elif call == "get":
            client.get_episode("ep-1")
        else:
            client.close_episode("ep-1")


def test_an_undecodable_body_raises_invalid_response() -> None:
    handler = answering(json.dumps(step_answer()), 200, **{"Content-Encoding": "gzip"})
    with client_for(handler) as client, pytest.raises(InvalidResponseError, match="undecodable"):
        client.step("ep-1", OBSERVATION, 1.0, 0.0)


def test_a_body_over_the_cap_is_refused_even_compressed() -> None:
    padded = json.dumps(step_answer()).encode() + b" " * (MAX_ANSWER_BYTES + 1)
    handler = answering(gzip.compress(padded, 1), 200, **{"Content-Encoding": "gzip"})
    with client_for(handler) as client, pytest.raises(InvalidResponseError, match="bytes"):
        client.step("ep-1", OBSERVATION, 1.0, 0.0)


def test_a_dripped_body_is_abandoned_after_the_read_timeout_and_retried_bounded() -> None:
    calls = []

    def drip() -> Iterator[bytes]:
        for byte in json.dumps(step_answer()).encode():
            time.sleep(0.02)  # each read well within the timeout, the whole body far beyond
            yield bytes([byte])

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, content=drip())

    started = time.monotonic()
    with client_for(handler, timeout=0.2) as client, pytest.raises(ServiceUnreachableError):
        client.step("ep-1", OBSERVATION, 1.0, 0.0, step=1)
    assert len(calls) == 1 + FAST.retries and time.monotonic() - started < 2.0


@pytest.mark.parametrize(
    ("status", "body"),
    [(500, "Traceback (most recent call last):\n  File x\nKeyError: 'y'\n"), (599, ""),
     (418, "x" * 100_000), (503, json.dumps({"code": "c", "detail": "one\ntwo", "field": None}))],
)  # fmt: skip
def test_an_error_without_the_documented_shape_gives_one_clear_line(status: int, body: str) -> None:
    with client_for(answering(body, status)) as client, pytest.raises(PolicyClientError) as raised:
        client.get_episode("ep-1")
    text = str(raised.value)
    assert "\n" not in text and len(text) < 700 and raised.value.detail.strip()
    assert isinstance(raised.value, ServerError) == (status >= 500)


def test_a_redirect_is_not_followed_and_says_where_it_pointed() -> None:
    handler = answering(b"", 307, Location="http://elsewhere.invalid/v1/models")
    with client_for(handler) as client, pytest.raises(PolicyClientError, match="elsewhere"):
        client.list_models()


def test_a_redirect_to_an_invalid_url_raises_invalid_response() -> None:
    handler = answering(b"", 302, Location="javascript:alert(1)")
    with client_for(handler) as client, pytest.raises(InvalidResponseError, match="URL"):
        client.update_budget("ep-1", cost_limit=4.0)


def test_a_negative_or_nan_hint_never_becomes_a_negative_or_nan_wait() -> None:
    assert RetryPolicy().after_refusal(0, 409, -5.0, False) == 0.0
    assert RetryPolicy().after_refusal(0, 429, math.nan, False) is None


def test_the_async_clients_call_ends_when_a_dripped_head_outlasts_the_read_timeout() -> None:
    async def drip_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\n")
            for _ in range(200):  # one byte of a header every 50 ms: no single read times out
                writer.write(b"X")
                await writer.drain()
                await asyncio.sleep(0.05)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client gave up and closed
        finally:
            writer.close()

    async def call() -> tuple[PolicyClientError, float]:
        server = await asyncio.start_server(drip_head, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        started = time.monotonic()
        async with server, AsyncPolicyClient(f"http://127.0.0.1:{port}", timeout=0.3) as client:
            client.retry = FAST
            with pytest.raises(PolicyClientError) as raised:
                await client.list_models()
        return raised.value, time.monotonic() - started

    error, seconds = asyncio.run(call())
    assert isinstance(error, ServiceUnreachableError) and "no answer's head within 0.3 s" in str(
        error
    )
    assert seconds < 3.0  # three attempts of 0.3 s and their waits, not the 10 s of dripping


def _drip_a_head(server: socket.socket) -> None:
    """Answer one request with a status line, then a header's bytes one every 50 ms."""
    with contextlib.suppress(OSError):  # the client gave up and closed
        connection, _ = server.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\n")
            for _ in range(200):  # no single read times out
                connection.sendall(b"X")
                time.sleep(0.05)


def test_the_sync_clients_call_ends_when_a_dripped_head_outlasts_the_read_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        for _ in range(3):  # the first attempt and its two retries
            threading.Thread(target=_drip_a_head, args=(server,), daemon=True).start()
        started = time.monotonic()
        with PolicyClient(f"http://127.0.0.1:{port}", timeout=0.3, retry=FAST) as client:
            with pytest.raises(ServiceUnreachableError) as raised:
                client.list_models()
        seconds = time.monotonic() - started
    assert "no answer's head within 0.3 s" in str(raised.value)
    assert seconds < 3.0  # three attempts of 0.3 s and their waits, not the 10 s of dripping


def test_the_head_limit_passes_a_slow_answer_that_arrives_within_it() -> None:
    body = b'{"models": []}'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"

    def answer_slowly(server: socket.socket) -> None:
        connection, _ = server.accept()
        with connection:
            connection.recv(65536)
            for part in (b"HTTP/1.1 ", (head % len(body))[9:] + body):
                connection.sendall(part)
                time.sleep(0.1)  # 0.2 s in all: within the 0.3 s limit

    with socket.create_server(("127.0.0.1", 0)) as server:
        threading.Thread(target=answer_slowly, args=(server,), daemon=True).start()
        port = server.getsockname()[1]
        with PolicyClient(f"http://127.0.0.1:{port}", timeout=0.3, retry=FAST) as client:
            assert client.list_models() == []


# ---- cdt rollout ---------------------------------------------------------------------------


class _Env(ToyEnv):
    def __init__(self) -> None:
        super().__init__(observation_dim=3, action_dim=2, length=4)
        self.observation_space = type("Box", (), {"shape": (3,)})()
        self.spec = type("Spec", (), {"max_episode_steps": 4})()


def _rollout(
    monkeypatch: pytest.MonkeyPatch,
    broken: Callable[[int, httpx.Request], httpx.Response | None],
    episodes: int = 3,
) -> int | str | None:
    """`cdt rollout` of `episodes` episodes; `broken(episode, request)` answers instead of the
    server when it returns a response (or raises what the transport would)."""
    created: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"models": [CARD]})
        if path == "/v1/episodes":
            created.append(len(created))
        episode = len(created) - 1
        answer = broken(episode, request)
        if answer is not None:
            return answer
        if request.method == "DELETE":
            return httpx.Response(200, json=summary_answer(f"ep-{episode}"))
        step = json.loads(request.content).get("step", 0)
        return httpx.Response(200, json=step_answer(f"ep-{episode}", step))

    def client(server: str, **options: Any) -> PolicyClient:
        return client_for(handler)

    monkeypatch.setattr("runtime.sim.make_env", lambda task: _Env())
    monkeypatch.setattr("runtime.sim.check_task", lambda task: None)
    monkeypatch.setattr("runtime.sim.seed_simulator", lambda seed: None)
    monkeypatch.setattr(rollout, "PolicyClient", client)
    with pytest.raises(SystemExit) as exited:
        rollout.main(["--server", "http://policy", "--model", "toy", "--episodes", str(episodes)])
    return exited.value.code


@pytest.mark.parametrize(
    "answer",
    [httpx.Response(200, content=b"{"), httpx.Response(200, json=step_answer(action=[9.0, 0.0])),
     httpx.Response(500, content=b"boom\nboom"), httpx.Response(200, json=step_answer("ep-x"))],
)  # fmt: skip
def test_rollout_reports_a_failed_episode_in_one_line_and_keeps_the_others(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], answer: httpx.Response
) -> None:
    def broken(episode: int, request: httpx.Request) -> httpx.Response | None:
        is_step = request.url.path.endswith("/step")
        if episode == 1 and is_step and json.loads(request.content)["step"] == 2:
            return httpx.Response(answer.status_code, content=answer.content)
        return None

    status = _rollout(monkeypatch, broken)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert status == 1 and "Traceback" not in out + err
    assert [line.split(":")[0] for line in lines[:3]] == ["seed 0", "seed 1", "seed 2"]
    assert ": steps 4 " in lines[0] and ": steps 4 " in lines[2]
    assert lines[1].startswith("seed 1: FAILED: ")
    summary = json.loads(lines[-1])
    assert (summary["episodes"], summary["episodes_failed"]) == (2, 1)


def test_rollout_whose_close_also_fails_reports_the_first_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(episode: int, request: httpx.Request) -> httpx.Response | None:
        if episode == 0 and request.url.path.endswith("/step"):
            return httpx.Response(
                200, content=json.dumps(step_answer("ep-0", action=[math.inf, 0.0]))
            )
        if episode == 0 and request.method == "DELETE":
            return httpx.Response(502, content=b"gateway")
        return None

    status = _rollout(monkeypatch, broken)
    out = capsys.readouterr().out
    assert status == 1 and "seed 0: FAILED: " in out and "finite" in out.splitlines()[0]
    assert json.loads(out.splitlines()[-1])["episodes"] == 2


def test_rollout_stops_after_three_episodes_in_a_row_without_an_answer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    closes_after_a_timeout: list[int] = []

    def broken(episode: int, request: httpx.Request) -> httpx.Response | None:
        if episode == 1 and request.url.path.endswith("/step"):
            return httpx.Response(500, content=b"answered, not well")  # an answer: not counted
        if episode >= 2 and request.method == "DELETE":
            closes_after_a_timeout.append(episode)
        if (episode >= 2 and request.url.path != "/v1/episodes") or episode >= 4:
            raise httpx.ReadTimeout("timed out", request=request)
        return None

    status = _rollout(monkeypatch, broken, episodes=9)
    lines = capsys.readouterr().out.splitlines()
    assert status == 1 and lines[0].startswith("seed 0: steps 4 ")
    assert [line.split(": ")[1] for line in lines[1:5]] == ["FAILED"] * 4
    assert lines[5] == "seeds 5-8: NOT RUN: the service did not answer the 3 episodes before"
    assert closes_after_a_timeout == []  # a frozen service is not asked again to close
    summary = json.loads(lines[-1])
    assert (summary["episodes"], summary["episodes_failed"]) == (1, 8)
