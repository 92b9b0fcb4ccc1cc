"""The websocket client against a real uvicorn server: episodes, concurrency, errors, closes."""

from __future__ import annotations

import asyncio

import pytest

from clients.client import (
    EpisodeGoneError,
    InvalidRequestError,
    NotFoundError,
    PolicyClient,
    ServiceUnreachableError,
)
from clients.stream import StreamClosedError, connect_stream, stream_url
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


async def test_stream_client_matches_the_rest_client(live_url: str) -> None:
    with PolicyClient(live_url) as rest:
        expected = rest.create_episode("toy", 50.0, 10.0, OBSERVATION, seed=6).action
    async with connect_stream(live_url) as stream:
        assert (await stream.start("toy", 50.0, 10.0, OBSERVATION, seed=6)).action == expected


async def test_stream_client_serves_concurrent_episodes_on_one_socket(live_url: str) -> None:
    async with connect_stream(live_url) as stream:

        async def episode(seed: int) -> list[float]:
            reply = await stream.start("toy", 50.0, 10.0, OBSERVATION, seed=seed)
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
