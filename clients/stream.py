"""Websocket client for `WS /v1/stream`: several episodes over one socket (`websockets`).

    async with connect_stream("http://127.0.0.1:8000") as stream:
        reply = await stream.start("cdt-carrun-paper", 575.0, 10.0, observation, seed=0)
        reply = await stream.step(reply.episode_id, observation, reward, cost, step=1)
        summary = await stream.end(reply.episode_id)

Each call sends one frame with a fresh `request_id` and awaits the reply carrying it, so several
tasks may share one socket. A refusal whose `error` frame carries `retry_after` is sent again
after that many seconds as `clients.retry.RetryPolicy` allows (409 `episode_busy`, 429; 503 only
for a numbered step). Other refusals raise the same `PolicyClientError` subclasses as the REST
client; a closed socket raises `StreamClosedError` with the close code (1008 bad frame or token,
1009 frame too big, 1011 server error). A reply that breaks the contract (unreadable, of the wrong
type, about another episode, an action that is not finite or, with the model's card in `cards`,
of the wrong length or out of its bounds) raises `InvalidResponseError`.

As with the REST client, a step or budget change may name the episode's `revision` (it applies
only to that revision, else `PreconditionFailedError`), and with `deadline_s` every such frame
carries a `deadline` that many seconds after it is sent, after which no replica applies it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import SupportsFloat, TypeVar

import pydantic
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from clients.answers import check_answer
from clients.client import DEFAULT_URL
from clients.errors import (
    InvalidRequestError,
    InvalidResponseError,
    PolicyClientError,
    ServiceUnreachableError,
    error_for_status,
    invalid_answer,
)
from clients.retry import RetryPolicy
from service.schemas import (
    EpisodePublic,
    EpisodeSummary,
    ModelPublic,
    StepResponse,
    StreamBudget,
    StreamEnd,
    StreamError,
    StreamReply,
    StreamStart,
    StreamStep,
)

Observation = Iterable[SupportsFloat]
Reply = StepResponse | EpisodePublic | EpisodeSummary | StreamError
ReplyT = TypeVar("ReplyT", StepResponse, EpisodePublic, EpisodeSummary)


class StreamClosedError(PolicyClientError):
    """The socket closed before the reply arrived; `close_code` says why."""

    def __init__(self, detail: str, close_code: int | None) -> None:
        super().__init__(f"stream closed ({close_code}): {detail}")
        self.close_code = close_code


def stream_url(base_url: str) -> str:
    """`http(s)://host:port` -> `ws(s)://host:port/v1/stream`; `ws(s)://` URLs pass unchanged."""
    if base_url.startswith(("ws://", "wss://")):
        return base_url
    scheme, _, rest = base_url.rstrip("/").partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest}/v1/stream"


class StreamClient:
    """Request/reply calls over one open websocket; create it with `connect_stream`."""

    def __init__(
        self,
        connection: ClientConnection,
        reply_timeout: float,
        retry: RetryPolicy,
        deadline_s: float | None = None,
        cards: Iterable[ModelPublic] = (),
    ) -> None:
        self._connection = connection
        self.cards = {card.name: card for card in cards}
        """The model cards actions are checked against (by the model a reply names)."""
        self._reply_timeout = reply_timeout
        self._retry = retry
        self.deadline_s = deadline_s
        """Seconds after sending a step or budget frame past which no replica applies it."""
        self._pending: dict[str, asyncio.Future[Reply]] = {}
        self._request_ids = (str(number) for number in itertools.count(1))
        self._last_error: StreamError | None = None
        self._unreadable: InvalidResponseError | None = None
        """The last frame no call could be told about (in a timeout's message)."""
        self._reader = asyncio.create_task(self._read_replies())

    async def start(
        self,
        model: str,
        target_reward: float,
        target_cost: float,
        observation: Observation,
        *,
        seed: int | None = None,
        deterministic: bool = False,
        budget_guard: bool = True,
        cut_floor: float | None = None,
    ) -> StepResponse:
        """`start`: open an episode; returns action 0 (`budget_guard=False`: without the
        server's budget guard; `cut_floor`: the lowest budget it may be cut to)."""
        values = [float(value) for value in observation]
        return await self._call(
            lambda request_id: StreamStart(
                type="start",
                request_id=request_id,
                model=model,
                target_reward=target_reward,
                target_cost=target_cost,
                observation=values,
                seed=None if seed is None else int(seed),
                deterministic=deterministic,
                budget_guard=None if budget_guard else False,
                cut_floor=cut_floor,
            ),
            StepResponse,
        )

    async def step(
        self,
        episode_id: str,
        observation: Observation,
        reward: float,
        cost: float,
        *,
        step: int | None = None,
        revision: int | None = None,
    ) -> StepResponse:
        """`step`: report the env's reward, cost and next observation; returns the next action.

        With `step` (this observation's index) it is repeatable: retried after a 503 too. With
        `revision` (an earlier answer's) it applies only if the episode is still at it."""
        values = [float(value) for value in observation]
        return await self._call(
            lambda request_id: StreamStep(
                type="step",
                request_id=request_id,
                episode_id=episode_id,
                observation=values,
                reward=reward,
                cost=cost,
                step=step,
                revision=revision,
                deadline=self._deadline(),
            ),
            StepResponse,
            repeatable=step is not None,
            episode=episode_id,
        )

    async def update_budget(
        self,
        episode_id: str,
        *,
        cost_limit: float | None = None,
        remaining_cost: float | None = None,
        target_reward: float | None = None,
        remaining_reward: float | None = None,
        revision: int | None = None,
    ) -> EpisodePublic:
        """`budget`: change the cost limit or reward target (with `revision`, only if the
        episode is still at it); returns the episode's state."""
        return await self._call(
            lambda request_id: StreamBudget(
                type="budget",
                request_id=request_id,
                episode_id=episode_id,
                cost_limit=cost_limit,
                remaining_cost=remaining_cost,
                target_reward=target_reward,
                remaining_reward=remaining_reward,
                revision=revision,
                deadline=self._deadline(),
            ),
            EpisodePublic,
            episode=episode_id,
        )

    async def end(self, episode_id: str) -> EpisodeSummary:
        """`end`: end an episode; returns its summary."""
        return await self._call(
            lambda request_id: StreamEnd(type="end", request_id=request_id, episode_id=episode_id),
            EpisodeSummary,
            episode=episode_id,
        )

    def _deadline(self) -> float | None:
        """A frame's deadline, counted from now (frames are built per attempt)."""
        return None if self.deadline_s is None else time.time() + self.deadline_s

    async def close(self) -> None:
        """Close the socket (1000) and stop reading."""
        await self._connection.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    async def _call(
        self,
        build: Callable[[str], pydantic.BaseModel],
        reply_type: type[ReplyT],
        *,
        repeatable: bool = False,
        episode: str | None = None,
    ) -> ReplyT:
        """Send the frame `build(request_id)` and return the reply carrying that id, sending it
        again (with a new id) while the service refuses it with a retry hint and `self._retry`
        allows; `repeatable`: safe to send again even if the refused attempt was applied;
        `episode`: the episode the reply must be about."""
        for attempt in itertools.count():
            reply = await self._exchange(build)
            if not isinstance(reply, StreamError):
                break
            wait = self._retry.after_refusal(attempt, reply.status, reply.retry_after, repeatable)
            if wait is None:
                raise error_for_status(
                    reply.status, reply.detail, reply.code, reply.field, reply.retry_after
                )
            await asyncio.sleep(wait)
        if not isinstance(reply, reply_type):
            expected = reply_type.__name__
            raise InvalidResponseError(f"a {type(reply).__name__} reply to a {expected} request")
        check_answer(reply, episode, self.cards)
        return reply

    async def _exchange(self, build: Callable[[str], pydantic.BaseModel]) -> Reply:
        """Send the frame `build(request_id)` once and await the reply carrying that id."""
        request_id = next(self._request_ids)
        try:
            message = build(request_id)  # validated here, before anything is sent
        except pydantic.ValidationError as error:
            field = ".".join(str(part) for part in error.errors()[0]["loc"])
            raise InvalidRequestError(str(error), field=field or None) from error
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._connection.send(message.model_dump_json(exclude_none=True))
            reply = await asyncio.wait_for(future, self._reply_timeout)
        except TimeoutError as error:
            detail = f"no reply within {self._reply_timeout} s"
            if self._unreadable is not None:
                detail += f" (the service sent an unreadable frame: {self._unreadable.detail})"
            raise ServiceUnreachableError(detail) from error
        except ConnectionClosed as closed:
            raise self._closed_error() from closed
        finally:
            self._pending.pop(request_id, None)
        return reply

    async def _read_replies(self) -> None:
        """Hand every reply to the call awaiting its `request_id`; fail them all at close."""
        try:
            async for raw in self._connection:
                self._dispatch(raw)
        except ConnectionClosed:
            pass
        finally:
            error = self._closed_error()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(error)

    def _dispatch(self, raw: str | bytes) -> None:
        """Hand one frame to the call awaiting it; an unreadable one fails that call, or, when
        it names no awaited call, is kept for the message of the call that times out."""
        try:
            reply = StreamReply.model_validate_json(raw).root
        except pydantic.ValidationError as error:
            problem = invalid_answer("a websocket frame", error)
            future = self._pending.get(_request_id(raw))
            if future is not None and not future.done():
                future.set_exception(problem)
            else:
                self._unreadable = problem
            return
        future = self._pending.get(reply.request_id or "")
        if future is not None and not future.done():
            future.set_result(reply)
        elif isinstance(reply, StreamError):
            self._last_error = reply  # e.g. the reason for a 1008 close

    def _closed_error(self) -> StreamClosedError:
        detail = self._connection.close_reason or "connection closed"
        if self._last_error is not None:
            detail = f"{detail}: {self._last_error.detail}"
        return StreamClosedError(detail, self._connection.close_code)


class _connect(connect):
    """`websockets.connect` that follows no redirect (nor does the REST client): the service
    never redirects, and each hop would be an attempt the retry policy does not count."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


def _request_id(raw: str | bytes) -> str:
    """The `request_id` of a frame the schema refused ("" when it names none)."""
    try:
        frame = json.loads(raw)
    except ValueError:
        return ""
    request_id = frame.get("request_id") if isinstance(frame, dict) else None
    return request_id if isinstance(request_id, str) else ""


@asynccontextmanager
async def connect_stream(
    base_url: str = DEFAULT_URL,
    *,
    token: str | None = None,
    open_timeout: float = 10.0,
    reply_timeout: float = 10.0,
    retry: RetryPolicy | None = None,
    deadline_s: float | None = None,
    cards: Iterable[ModelPublic] = (),
) -> AsyncIterator[StreamClient]:
    """Open `WS /v1/stream` and yield a `StreamClient`; the socket closes on exit.

    Args:
        base_url: the service (`http://host:port`) or the full `ws://` URL of the stream.
        token: bearer token, when the service requires one.
        open_timeout: seconds to connect.
        reply_timeout: seconds to wait for each reply.
        retry: which refused frames are sent again, how often (default `RetryPolicy()`).
        deadline_s: each step or budget frame applies within this many seconds of being
            sent, or never (at most `reply_timeout`: a frame that got no reply in time is
            then never applied later). None: no deadline.
        cards: the cards of the models used (`GET /v1/models`): actions are checked against
            them (length and bounds); without, only that they are finite.

    Raises (on opening): `ServiceUnreachableError`, or the status's error when the service
    refuses the websocket (e.g. `AuthenticationError`).
    """
    headers = {"Authorization": f"Bearer {token}"} if token else None
    url = stream_url(base_url)
    try:
        connection = await _connect(
            url, additional_headers=headers, open_timeout=open_timeout, close_timeout=reply_timeout
        )
    except InvalidStatus as refused:
        status = refused.response.status_code
        body = (refused.response.body or b"").decode(errors="replace")
        detail = f"the service refused to open {url}: {body}"
        if 300 <= status < 400:
            location = refused.response.headers.get("Location")
            detail = f"the service redirected {url} to {location!r} (not followed)"
        raise error_for_status(status, detail) from refused
    except (OSError, TimeoutError, WebSocketException) as error:
        raise ServiceUnreachableError(f"cannot open {url}: {error!r}") from error
    retry = retry if retry is not None else RetryPolicy()
    client = StreamClient(connection, reply_timeout, retry, deadline_s, cards)
    try:
        yield client
    finally:
        await client.close()
