"""`WS /v1/stream`: several episodes over one socket, one JSON frame per request.

Inbound frames are `StreamMessage`s (`start`, `step`, `budget`, `end`), answered in order by
`action`, `state`, `ended` or `error` frames that echo the frame's `request_id`.

Close codes: a frame that is not a valid `StreamMessage` (bad JSON, unknown type, a field out of
range) gets an `error` frame and then close 1008, as does a handshake without a valid token; a
frame over the size limit closes with 1009; an internal error closes with 1011. A well-formed
frame the service refuses (unknown or ended episode, wrong observation length, 429...) gets an
`error` frame carrying the REST status, and the socket stays open: it may carry other episodes.
This deviates from closing on an unknown episode, which suits one-episode sockets only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect, status
from pydantic import BaseModel, ValidationError

from service.deps import EpisodeServiceDep, token_accepted, websocket_token
from service.episodes import EpisodeService
from service.errors import ServiceError
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


@router.websocket("/stream")
async def stream(websocket: WebSocket, service: EpisodeServiceDep) -> None:
    """Run several episodes over one websocket."""
    await websocket.accept()
    if not token_accepted(websocket_token(websocket), service.settings.api_tokens):
        await websocket.close(status.WS_1008_POLICY_VIOLATION, "missing or invalid bearer token")
        return
    try:
        while True:
            frame = await receive_frame(websocket)
            reply, close_code = await handle_frame(frame, service)
            await websocket.send_text(reply.model_dump_json())
            if close_code is not None:
                await websocket.close(close_code, "invalid message")
                return
    except WebSocketDisconnect as disconnect:
        logger.debug("stream client went away (code %s)", disconnect.code)
    except Exception:
        logger.exception("stream failed")
        service.metrics.errors.labels("internal_error").inc()
        with contextlib.suppress(RuntimeError):  # the socket may already be gone
            await websocket.close(status.WS_1011_INTERNAL_ERROR, "internal error")


async def receive_frame(websocket: WebSocket) -> str | bytes:
    """The next text or binary frame; raises `WebSocketDisconnect` when the client leaves."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", status.WS_1000_NORMAL_CLOSURE))
    text: str | None = message.get("text")
    return text if text is not None else bytes(message.get("bytes") or b"")


async def handle_frame(frame: str | bytes, service: EpisodeService) -> tuple[BaseModel, int | None]:
    """Validate and run one frame; returns the reply and a close code (None: keep open)."""
    if len(frame) > service.settings.max_body_bytes:
        error = _error(413, "payload_too_large", "frame exceeds the size limit", "frame")
        return error, status.WS_1009_MESSAGE_TOO_BIG
    try:
        message = StreamMessage.model_validate_json(frame).root
    except ValidationError as invalid:
        service.metrics.errors.labels("validation_error").inc()
        field, detail = describe_validation_error(invalid.errors())
        return _error(422, "validation_error", detail, field), status.WS_1008_POLICY_VIOLATION
    try:
        return await dispatch(message, service), None
    except ServiceError as refused:
        service.metrics.errors.labels(refused.code).inc()
        error = _error(refused.status_code, refused.code, refused.detail, refused.field)
        error.request_id = message.request_id
        error.episode_id = getattr(message, "episode_id", None)
        return error, None


async def dispatch(message: Inbound, service: EpisodeService) -> BaseModel:
    """Run one validated frame against the episode service."""
    request_id = message.request_id
    if isinstance(message, StreamStart):
        with service.timed("ws", "start"):
            started = await service.start_async(message)
        return StreamAction.model_construct(**dict(started), request_id=request_id)
    if isinstance(message, StreamStep):
        with service.timed("ws", "step"):
            stepped = await service.step_async(message.episode_id, message)
        return StreamAction.model_construct(**dict(stepped), request_id=request_id)
    if isinstance(message, StreamBudget):
        state = await service.run(service.update_budget, message.episode_id, message)
        return StreamState.model_construct(**dict(state), request_id=request_id)
    ended = await service.run(service.end, message.episode_id)
    return StreamEnded.model_construct(**dict(ended), request_id=request_id)


def describe_validation_error(
    errors: Sequence[Mapping[str, Any]], drop: frozenset[str] = FRAME_TYPES
) -> tuple[str | None, str]:
    """The first offending field (dotted path) and a readable summary of all errors.

    Args:
        errors: pydantic's `ValidationError.errors()` (or FastAPI's equivalent).
        drop: leading location parts that name no field (a union tag, `body`, `path`...).
    """
    fields: list[str] = []
    for item in errors:
        location = [str(part) for part in item["loc"]]
        if len(location) > 1 and location[0] in drop:
            location = location[1:]
        fields.append(".".join(location) or "frame")
    messages = [f"{field}: {item['msg']}" for field, item in zip(fields, errors, strict=True)]
    detail = "; ".join(messages)
    return (fields[0] if fields else None), detail[:2000]


def _error(status_code: int, code: str, detail: str, field: str | None) -> StreamError:
    return StreamError(status=status_code, code=code, detail=detail, field=field)
