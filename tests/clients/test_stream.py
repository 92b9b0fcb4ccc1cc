"""The websocket client against a real uvicorn server: episodes, concurrency, errors, closes."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, cast

import pytest

from clients.client import (
    ConflictError,
    EpisodeGoneError,
    InvalidRequestError,
    NotFoundError,
    PolicyClient,
    PreconditionFailedError,
    ServerError,
    ServiceUnreachableError,
)
from clients.retry import RetryPolicy
from clients.stream import StreamClient, StreamClosedError, connect_stream, stream_url
from tests.clients.live_server import TOKEN

pytestmark = pytest.mark.anyio
OBSERVATION = [0.1, -0.2, 0.3]


async def test_stream_client_runs_an_episode(live_url: str) -> None:
    async with connect_stream(live_url) as stream:
        started = await stream.start("toy", 50.0, 10.0, OBSERVATION, seed=2)
        stepped = await stream.step(started.episode_id, OBSERVATION, 1.0, 2.0, step=1)
        assert (stepped.step, stepped.remaining_cost) == (1, 8.0)
        state = await stream.update_budget(started.episode_id, cost_limit=4.0)
        assert state.remaining_cost == 2.0
        summary = await stream.end(started.episode_id)
        assert (summary.steps, summary.total_cost) == (2, 2.0)
        with pytest.raises(EpisodeGoneError):
            await stream.step(started.episode_id, OBSERVATION, 0.0, 0.0)


async def test_stream_client_sends_the_revision_and_the_deadline_it_is_given(
    live_url: str,
) -> None:
    async with connect_stream(live_url, deadline_s=5.0) as stream:
        started = await stream.start("toy", 50.0, 10.0, OBSERVATION)
        episode_id, revision = started.episode_id, started.revision
        state = await stream.update_budget(episode_id, cost_limit=5.0, revision=revision)
        with pytest.raises(PreconditionFailedError) as stale:
            await stream.update_budget(episode_id, cost_limit=30.0, revision=revision)
        assert (stale.value.status_code, stale.value.code) == (412, "revision_mismatch")
        stepped = await stream.step(episode_id, OBSERVATION, 1.0, 0.0, revision=state.revision)
        assert (stepped.step, stepped.revision) == (1, 2)
    async with connect_stream(live_url, deadline_s=-1.0) as late:  # every frame arrives late
        with pytest.raises(PreconditionFailedError) as refused:
            await late.update_budget(episode_id, cost_limit=30.0)
        assert refused.value.code == "deadline_passed"
    with PolicyClient(live_url) as rest:
        assert rest.get_episode(episode_id).target_cost == 5.0


async def test_stream_client_matches_the_rest_client(live_url: str) -> None:
    with PolicyClient(live_url) as rest:
        expected = rest.create_episode("toy", 50.0, 10.0, OBSERVATION, seed=6).action
    async with connect_stream(live_url) as stream:
        assert (await stream.start("toy", 50.0, 10.0, OBSERVATION, seed=6)).action == expected


async def test_stream_client_sends_an_episodes_cut_floor(live_url: str) -> None:
    async with connect_stream(live_url) as stream:
        started = await stream.start("toy", 50.0, 40.0, OBSERVATION, seed=6, cut_floor=10.0)
    with PolicyClient(live_url) as rest:
        assert rest.get_episode(started.episode_id).cut_floor == 10.0


async def test_stream_client_serves_concurrent_episodes_on_one_socket(live_url: str) -> None:
    async with connect_stream(live_url) as stream:

        async def episode(seed: int) -> list[float]:
            # sampled actions (the budget guard would take the mean at 10 left of 100 steps)
            reply = await stream.start(
                "toy", 50.0, 10.0, OBSERVATION, seed=seed, budget_guard=False
            )
            for t in range(1, 4):
                reply = await stream.step(reply.episode_id, OBSERVATION, 1.0, 0.0, step=t)
            return reply.action

        results = await asyncio.gather(*(episode(seed) for seed in (1, 2, 1)))
    assert results[0] == results[2] and results[0] != results[1]


async def test_stream_client_error_keeps_the_socket_usable(live_url: str) -> None:
    async with connect_stream(live_url) as stream:
        with pytest.raises(NotFoundError):
            await stream.end("unknown")
        with pytest.raises(InvalidRequestError) as invalid:
            await stream.start("toy", 1.0, 1.0, [1.0])
        assert invalid.value.field == "observation"
        assert (await stream.start("toy", 1.0, 1.0, OBSERVATION)).step == 0


async def test_stream_client_validates_frames_before_sending(live_url: str) -> None:
    async with connect_stream(live_url) as stream:
        with pytest.raises(InvalidRequestError):
            await stream.step("abc", [float("inf")], 0.0, 0.0)
        assert (await stream.start("toy", 1.0, 1.0, OBSERVATION)).step == 0


async def test_stream_client_without_token_gets_closed_1008(secured_url: str) -> None:
    async with connect_stream(secured_url) as stream:
        with pytest.raises(StreamClosedError) as closed:
            await stream.start("toy", 1.0, 1.0, OBSERVATION)
    assert closed.value.close_code == 1008


async def test_stream_client_with_token_is_served(secured_url: str) -> None:
    async with connect_stream(secured_url, token=TOKEN) as stream:
        assert (await stream.start("toy", 1.0, 1.0, OBSERVATION)).step == 0


async def test_stream_client_unreachable_server_raises() -> None:
    with pytest.raises(ServiceUnreachableError):
        async with connect_stream("http://127.0.0.1:9", open_timeout=1.0):
            pass


def test_stream_url_derives_the_websocket_address() -> None:
    assert stream_url("http://h:1/") == "ws://h:1/v1/stream"
    assert stream_url("https://h") == "wss://h/v1/stream"
    assert stream_url("ws://h/v1/stream") == "ws://h/v1/stream"


class ScriptedSocket:
    """Stands in for a websocket connection: answers each frame with the next scripted reply."""

    close_code: int | None = None
    close_reason: str | None = None

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies, self.sent = replies, []
        self.inbox: asyncio.Queue[str | None] = asyncio.Queue()

    async def send(self, text: str) -> None:
        frame = json.loads(text)
        self.sent.append(frame)
        reply = self.replies.pop(0) | {"request_id": frame["request_id"]}
        await self.inbox.put(json.dumps(reply))

    def __aiter__(self) -> ScriptedSocket:
        return self

    async def __anext__(self) -> str:
        if (text := await self.inbox.get()) is None:
            raise StopAsyncIteration
        return text

    async def close(self) -> None:
        await self.inbox.put(None)


def refusal(status: int, code: str, retry_after: int | None) -> dict[str, Any]:
    error = {"type": "error", "status": status, "code": code, "detail": "refused"}
    return error | {"retry_after": retry_after}


ACTION = {"type": "action", "episode_id": "e", "action": [0.5], "step": 1}
ACTION |= {"remaining_reward": 1.0, "remaining_cost": 1.0, "budget_exhausted": False}
ACTION |= {"model": "toy", "model_version": "1"}


async def scripted(replies: list[dict[str, Any]], retries: int = 2) -> tuple[StreamClient, Any]:
    socket = ScriptedSocket(replies)
    return StreamClient(cast(Any, socket), 5.0, RetryPolicy(retries=retries)), socket


async def test_stream_client_resends_a_busy_frame_with_a_new_request_id() -> None:
    stream, socket = await scripted([refusal(409, "episode_busy", 0), ACTION])
    assert (await stream.step("e", OBSERVATION, 0.0, 0.0)).action == [0.5]
    first, again = socket.sent
    assert first["request_id"] != again["request_id"]
    assert {**first, "request_id": ""} == {**again, "request_id": ""}
    await stream.close()


async def test_stream_client_resends_a_503_only_for_a_numbered_step() -> None:
    stream, socket = await scripted([refusal(503, "store_unavailable", 0)])
    with pytest.raises(ServerError) as refused:
        await stream.step("e", OBSERVATION, 0.0, 0.0)  # it may have gone through
    assert refused.value.retry_after == 0 and len(socket.sent) == 1
    await stream.close()
    stream, socket = await scripted([refusal(503, "store_unavailable", 0), ACTION])
    assert (await stream.step("e", OBSERVATION, 0.0, 0.0, step=1)).step == 1
    assert len(socket.sent) == 2
    await stream.close()


async def test_stream_client_does_not_resend_without_a_hint_or_past_its_retries() -> None:
    stream, socket = await scripted([refusal(409, "step_out_of_order", None)])
    with pytest.raises(ConflictError):
        await stream.step("e", OBSERVATION, 0.0, 0.0, step=4)
    assert len(socket.sent) == 1
    await stream.close()
    stream, socket = await scripted([refusal(409, "episode_busy", 0)] * 3, retries=2)
    with pytest.raises(ConflictError) as busy:
        await stream.update_budget("e", cost_limit=1.0)
    assert busy.value.code == "episode_busy" and len(socket.sent) == 3
    await stream.close()


async def test_stream_client_start_over_the_quota_waits_its_retry_after(quota_url: str) -> None:
    async with connect_stream(quota_url, token=TOKEN) as stream:
        first = await stream.start("toy", 1.0, 1.0, OBSERVATION)

        async def end_soon() -> None:
            await asyncio.sleep(0.3)
            await stream.end(first.episode_id)

        began = time.monotonic()
        ending = asyncio.create_task(end_soon())
        second = await stream.start("toy", 1.0, 1.0, OBSERVATION)  # 429, retry_after 1 s
        await ending
        assert second.step == 0 and time.monotonic() - began >= 1.0
        await stream.end(second.episode_id)
