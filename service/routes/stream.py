"""`WS /v1/stream`: several episodes over one socket, one JSON frame per request.

Inbound frames are `StreamMessage`s (`start`, `step`, `budget`, `end`), answered in order by
`action`, `state`, `ended` or `error` frames that echo the frame's `request_id`.

Every frame that fails gets an `error` frame carrying the REST status (and, for a retryable
refusal, the REST answer's `Retry-After` as `retry_after`) and echoing the frame's `request_id`
and `episode_id` when they can be read, and the socket stays open: it may carry other episodes.
That holds for a frame that is not a valid `StreamMessage` (bad JSON, unknown type, a field out
of range) and for a well-formed frame the service refuses (unknown or ended episode, wrong
observation length, 429...). Close codes: 1001 after `ws_idle_timeout_s` without a frame;
1008 for a handshake without a valid token, and after `ws_max_invalid_frames` invalid frames in
a row (a client that only sends garbage; refusals do not count: they answer for one episode, not
for a broken client); 1009 for a frame over the size limit; 1011 for an internal error. Closing
ends no episode, whoever closes: they stay open for another socket or REST until they end or
expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pydantic_core
from fastapi import APIRouter, WebSocket, WebSocketDisconnect, status
from pydantic import BaseModel, ValidationError

from service.deps import EpisodeServiceDep, token_accepted, websocket_token
from service.episodes import EpisodeService
from service.errors import (
    EpisodeGoneError,
    EpisodeNotFoundError,
    RevisionMismatchError,
    ServiceError,
    SocketEpisodeLimitError,
)
from service.preconditions import Precondition
from service.schemas import (
    StreamAction,
    StreamBudget,
    StreamEnd,
    StreamEnded,
    StreamError,
    StreamMessage,
    StreamStart,
    StreamState,
    StreamStep,
)

logger = logging.getLogger(__name__)
router = APIRouter(tags=["stream"])
Inbound = StreamStart | StreamStep | StreamBudget | StreamEnd
FRAME_TYPES = frozenset({"start", "step", "budget", "end"})
IDLE_CLOSE_CODE = status.WS_1001_GOING_AWAY
"""Close code for a socket idle for `ws_idle_timeout_s`. RFC 6455 (7.4.1) defines 1001 as the
endpoint leaving the connection; 1000 would claim the connection's purpose was fulfilled, which
the server cannot know (the client may still mean to step its episodes), and 1008 means a
received message broke a policy, where nothing was received (here it also says "fix your
client": a bad token, garbage frames). 1001 is what other servers send for idle timeouts too
(Jetty's "Idle Timeout"), and clients treat it as a clean close they may reconnect after."""


@router.websocket("/stream")
async def stream(websocket: WebSocket, service: EpisodeServiceDep) -> None:
    """Run several episodes over one websocket."""
    await websocket.accept()
    if not token_accepted(websocket_token(websocket), service.settings.api_tokens):
        await websocket.close(status.WS_1008_POLICY_VIOLATION, "missing or invalid bearer token")
        return
    try:
        await serve_frames(websocket, service)
    except WebSocketDisconnect as disconnect:
        logger.debug("stream client went away (code %s)", disconnect.code)
    except Exception:
        logger.exception("stream failed")
        service.metrics.errors.labels("internal_error").inc()
        with contextlib.suppress(RuntimeError):  # the socket may already be gone
            await websocket.close(status.WS_1011_INTERNAL_ERROR, "internal error")


async def receive_frame(websocket: WebSocket, idle_timeout_s: float) -> str | bytes | None:
    """The next text or binary frame, or None when none came within `idle_timeout_s`; raises
    `WebSocketDisconnect` when the client leaves."""
    try:
        async with asyncio.timeout(idle_timeout_s):
            message = await websocket.receive()
    except TimeoutError:
        return None
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", status.WS_1000_NORMAL_CLOSURE))
    text: str | None = message.get("text")
    return text if text is not None else bytes(message.get("bytes") or b"")


async def serve_frames(websocket: WebSocket, service: EpisodeService) -> None:
    """Answer frames until the client leaves or a close is due."""
    settings = service.settings
    invalid_run = 0
    started: set[str] = set()  # live episodes this socket started (ws_max_episodes_per_socket)
    while True:
        frame = await receive_frame(websocket, settings.ws_idle_timeout_s)
        if frame is None:  # an idle socket holds one of the worker's `http_max_connections`
            logger.debug("closing idle stream socket; its %d live episodes stay", len(started))
            reason = f"idle for {settings.ws_idle_timeout_s:g} s without a frame"
            await websocket.close(IDLE_CLOSE_CODE, reason)
            return
        if len(frame) > settings.max_body_bytes:
            error = _error(413, "payload_too_large", "frame exceeds the size limit", "frame")
            await websocket.send_text(error.model_dump_json())
            await websocket.close(status.WS_1009_MESSAGE_TOO_BIG, "frame too big")
            return
        reply, invalid = await handle_frame(frame, service, started)
        invalid_run = invalid_run + 1 if invalid else 0
        await websocket.send_text(reply.model_dump_json())
        if invalid_run >= settings.ws_max_invalid_frames:
            reason = f"{invalid_run} invalid frames in a row"
            await websocket.close(status.WS_1008_POLICY_VIOLATION, reason)
            return


async def handle_frame(
    frame: str | bytes, service: EpisodeService, started: set[str]
) -> tuple[BaseModel, bool]:
    """Validate and run one frame; returns the reply and whether the frame was invalid.

    `started` holds the live episodes the socket started (it adds and drops them).
    """
    try:
        message = StreamMessage.model_validate_json(frame).root
    except ValidationError as invalid:
        service.metrics.errors.labels("validation_error").inc()
        field, detail = describe_validation_error(invalid.errors())
        error = _error(422, "validation_error", detail, field)
        error.request_id, error.episode_id = frame_ids(frame)
        return error, True
    try:
        return await dispatch(message, service, started), False
    except ServiceError as refused:
        service.metrics.errors.labels(refused.code).inc()
        error = _error(refused.status_code, refused.code, refused.detail, refused.field)
        error.retry_after = refused.retry_after  # the REST answer's Retry-After
        if isinstance(refused, RevisionMismatchError):  # the REST answer's ETag
            error.revision = refused.revision
        error.request_id = message.request_id
        error.episode_id = getattr(message, "episode_id", None)
        return error, False


def frame_ids(frame: str | bytes) -> tuple[str | None, str | None]:
    """`request_id` and `episode_id` of an invalid frame, when it is a JSON object holding them."""
    try:
        value = pydantic_core.from_json(frame)
    except ValueError:
        return None, None
    if not isinstance(value, dict):
        return None, None
    request_id, episode_id = value.get("request_id"), value.get("episode_id")
    return (
        request_id if isinstance(request_id, str) else None,
        episode_id if isinstance(episode_id, str) else None,
    )


async def dispatch(message: Inbound, service: EpisodeService, started: set[str]) -> BaseModel:
    """Run one validated frame against the episode service; `started`: as `handle_frame`."""
    request_id = message.request_id
    if isinstance(message, StreamStep):  # most frames are steps: tested first
        precondition = Precondition.of(message.revision, message.deadline)
        with service.timed("ws", "step"):
            action = await service.step(
                message.episode_id, message, reply=StreamAction, precondition=precondition
            )
        action.request_id = request_id
        return action
    if isinstance(message, StreamStart):
        limit = service.settings.ws_max_episodes_per_socket
        if len(started) >= limit:  # some may have ended over REST or another socket, or expired
            started -= await ended_elsewhere(service, started)
        if len(started) >= limit:
            detail = f"this socket started {limit} live episodes, its limit; end one first"
            raise SocketEpisodeLimitError(detail, "type")
        with service.timed("ws", "start"):
            action = await service.start(message, reply=StreamAction)
        started.add(action.episode_id)
        action.request_id = request_id
        return action
    # validating the reply's fields costs a third of `model_construct(**dict(answer))`
    if isinstance(message, StreamBudget):
        precondition = Precondition.of(message.revision, message.deadline)
        state = await service.update_budget(message.episode_id, message, precondition)
        return StreamState(**vars(state), request_id=request_id)
    ended = await service.end(message.episode_id)
    started.discard(message.episode_id)
    return StreamEnded(**vars(ended), request_id=request_id)


async def ended_elsewhere(service: EpisodeService, started: set[str]) -> set[str]:
    """The episodes of `started` that are no longer live: ended over REST or another socket, or
    expired (410), or unknown by now (404). Asked only at the socket's limit, all in one batch."""
    episodes = sorted(started)
    answers = await asyncio.gather(
        *(service.describe(episode) for episode in episodes), return_exceptions=True
    )
    return {
        episode
        for episode, answer in zip(episodes, answers, strict=True)
        if isinstance(answer, EpisodeGoneError | EpisodeNotFoundError)
    }


def describe_validation_error(
    errors: Sequence[Mapping[str, Any]], drop: frozenset[str] = FRAME_TYPES, whole: str = "frame"
) -> tuple[str | None, str]:
    """The first offending field (dotted path) and a readable summary of all errors.

    Args:
        errors: pydantic's `ValidationError.errors()` (or FastAPI's equivalent).
        drop: leading location parts that name no field (a union tag, `body`, `path`...).
        whole: the field named for an error of the whole message (or of a field named "").
    """
    fields: list[str] = []
    for item in errors:
        location = [str(part) for part in item["loc"]]
        if len(location) > 1 and location[0] in drop:
            location = location[1:]
        fields.append(".".join(location) or whole)
    messages = [
        f"{field}: {str(item['msg']).removeprefix('Value error, ')}"
        for field, item in zip(fields, errors, strict=True)
    ]
    detail = "; ".join(messages)
    return (fields[0] if fields else None), detail[:2000]


def _error(status_code: int, code: str, detail: str, field: str | None) -> StreamError:
    return StreamError(status=status_code, code=code, detail=detail, field=field)
