"""The websocket client against a broken or hostile server: what `bench/fuzz_clients.py` found.
A reply that breaks the contract raises `InvalidResponseError`, an unreadable frame never kills
the socket's reader, and a refused handshake raises a typed error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve

from clients.client import AuthenticationError, PolicyClientError, ServiceUnreachableError
from clients.errors import InvalidResponseError
from clients.retry import RetryPolicy
from clients.stream import connect_stream
from service.schemas import ModelPublic

pytestmark = pytest.mark.anyio
OBSERVATION = [0.1, 0.2, 0.3]
CARD = ModelPublic(
    name="toy", version="1", task="toy-task", observation_dim=3, action_dim=2,
    action_low=[-1.0, -1.0], action_high=[1.0, 1.0], context_len=4, max_episode_len=4,
)  # fmt: skip
Replier = Callable[[dict[str, Any], ServerConnection], Awaitable[None]]


def action(frame: dict[str, Any], **changes: Any) -> str:
    reply = {"type": "action", "request_id": frame.get("request_id"), "action": [0.25, -0.5],
             "episode_id": frame.get("episode_id", "ep-1"), "step": 1, "remaining_reward": 5.0,
             "remaining_cost": 2.0, "budget_exhausted": False, "model": "toy",
             "model_version": "1"}  # fmt: skip
    return json.dumps(reply | changes)


@asynccontextmanager
async def hostile(replier: Replier) -> AsyncIterator[str]:
    """A websocket server answering every frame with `replier`; yields its ws:// URL."""

    async def handler(socket: ServerConnection) -> None:
        async for raw in socket:
            await replier(json.loads(raw), socket)

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}"


def replying(*frames: Callable[[dict[str, Any]], str | bytes]) -> Replier:
    async def replier(frame: dict[str, Any], socket: ServerConnection) -> None:
        for build in frames:
            await socket.send(build(frame))

    return replier


@pytest.mark.parametrize(
    "reply",
    [lambda f: json.dumps({"type": "action", "request_id": f["request_id"]}),
     lambda f: action(f, action=[0.1, None]),
     lambda f: json.dumps({"type": "error", "request_id": f["request_id"], "status": 503,
                           "code": None, "detail": "busy", "retry_after": 0.5})],
)  # fmt: skip
async def test_an_unreadable_reply_fails_its_call_typed_and_the_socket_closes_cleanly(
    reply: Callable[[dict[str, Any]], str],
) -> None:
    async with hostile(replying(reply)) as url:
        async with connect_stream(url, reply_timeout=2.0) as stream:
            with pytest.raises(InvalidResponseError) as raised:
                await stream.step("ep-1", OBSERVATION, 1.0, 0.0)
            assert "\n" not in str(raised.value)


@pytest.mark.parametrize("garbage", ["}{", "null", "[1]", b"\xff\xfe\x00"])
async def test_a_garbage_frame_does_not_kill_the_reader(garbage: str | bytes) -> None:
    async with hostile(replying(lambda f: garbage, action)) as url:
        async with connect_stream(url, reply_timeout=2.0) as stream:
            first = await stream.step("ep-1", OBSERVATION, 1.0, 0.0)
            second = await stream.step("ep-1", OBSERVATION, 1.0, 0.0)
            assert first.action == second.action == [0.25, -0.5]


async def test_a_call_that_only_got_garbage_times_out_naming_it() -> None:
    async with hostile(replying(lambda f: "}{")) as url:
        async with connect_stream(url, reply_timeout=0.3) as stream:
            with pytest.raises(ServiceUnreachableError, match="unreadable frame"):
                await stream.step("ep-1", OBSERVATION, 1.0, 0.0)


@pytest.mark.parametrize("values", [["NaN", 0.0], [0.0, "Infinity"], [0.1], [1.5, 0.0]])
async def test_a_bad_action_is_never_returned(values: list[Any]) -> None:
    text = json.dumps(values).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
    bad = lambda f: action(f).replace("[0.25, -0.5]", text)  # noqa: E731
    async with hostile(replying(bad)) as url:
        async with connect_stream(url, reply_timeout=2.0, cards=[CARD]) as stream:
            with pytest.raises(InvalidResponseError, match="action"):
                await stream.step("ep-1", OBSERVATION, 1.0, 0.0, step=1)


async def test_a_reply_about_another_episode_or_of_another_type_is_refused() -> None:
    async with hostile(replying(lambda f: action(f, episode_id="ep-999"))) as url:
        async with connect_stream(url, reply_timeout=2.0) as stream:
            with pytest.raises(InvalidResponseError, match="ep-999"):
                await stream.step("ep-1", OBSERVATION, 1.0, 0.0)
            with pytest.raises(InvalidResponseError, match="reply to a EpisodeSummary"):
                await stream.end("ep-1")


async def test_a_negative_retry_hint_is_retried_bounded() -> None:
    sent = []

    async def busy(frame: dict[str, Any], socket: ServerConnection) -> None:
        sent.append(frame)
        error = {"type": "error", "status": 409, "code": "episode_busy", "detail": "busy"}
        await socket.send(
            json.dumps(error | {"request_id": frame["request_id"], "retry_after": -5})
        )

    async with hostile(busy) as url:
        async with connect_stream(url, retry=RetryPolicy(retries=2)) as stream:
            with pytest.raises(PolicyClientError):
                await stream.step("ep-1", OBSERVATION, 1.0, 0.0)
    assert len(sent) == 3


@asynccontextmanager
async def raw_http(answer: bytes) -> AsyncIterator[str]:
    """A socket server that answers the websocket handshake with `answer`."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_redirected_handshake_is_not_followed() -> None:
    redirect = b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n"
    async with raw_http(redirect) as url:
        with pytest.raises(PolicyClientError, match="not followed") as raised:
            async with connect_stream(url, open_timeout=2.0):
                pass
    assert raised.value.status_code == 307


@pytest.mark.parametrize(
    ("answer", "error"),
    [(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 4\r\n\r\nnope", AuthenticationError),
     (b'HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}', PolicyClientError),
     (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", ServiceUnreachableError),
     (b"HTTP/1.1 302 Found\r\nLocation: javascript:alert(1)\r\nContent-Length: 0\r\n\r\n",
      PolicyClientError)],
)  # fmt: skip
async def test_a_refused_handshake_raises_a_typed_error(
    answer: bytes, error: type[PolicyClientError]
) -> None:
    async with raw_http(answer) as url:
        with pytest.raises(error):
            async with connect_stream(url, open_timeout=2.0):
                pass
