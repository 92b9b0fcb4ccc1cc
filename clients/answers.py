"""Reading and checking the service's answers, so that a broken server cannot hand a caller bad
data: bodies are read whole within a time limit and up to `MAX_ANSWER_BYTES`, and an action that
is not finite, or (when the model card is known) of the wrong length or outside the card's
bounds, or an answer about another episode, raises `InvalidResponseError`.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx

from clients.errors import InvalidResponseError, invalid_answer
from service.schemas import ModelPublic, StepResponse

MAX_ANSWER_BYTES = 8 * 2**20
"""Largest answer body read (decoded); every answer of API v1 is far smaller."""
BOUND_TOLERANCE = 1e-6
"""Relative slack on the card's action bounds (the service computes actions in float32)."""
_DROPPED_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


def read_limit(timeout: float | httpx.Timeout) -> float:
    """Seconds a body may take to arrive whole after its headers: the read timeout (a body
    dripped a byte at a time never trips a per-read timeout)."""
    read = timeout.read if isinstance(timeout, httpx.Timeout) else timeout
    return math.inf if read is None else float(read)


class _Body:
    """Collects a body's chunks, failing once it is too large or too late."""

    def __init__(self, limit_s: float) -> None:
        self.deadline = time.monotonic() + limit_s
        self.limit_s = limit_s
        self.chunks: list[bytes] = []
        self.size = 0

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > MAX_ANSWER_BYTES:
            raise InvalidResponseError(f"the service's answer is over {MAX_ANSWER_BYTES} bytes")
        if time.monotonic() > self.deadline:
            raise httpx.ReadTimeout(f"the answer's body took over {self.limit_s:g} s")
        self.chunks.append(chunk)

    def response(self, streamed: httpx.Response) -> httpx.Response:
        """The streamed response, whole (decoded, so without its transfer headers)."""
        headers = [(k, v) for k, v in streamed.headers.items() if k not in _DROPPED_HEADERS]
        return httpx.Response(
            streamed.status_code,
            headers=headers,
            content=b"".join(self.chunks),
            request=streamed.request,
            extensions=streamed.extensions,
        )


def read_whole(response: httpx.Response, limit_s: float) -> httpx.Response:
    """Read a streamed response's body within `limit_s` seconds and `MAX_ANSWER_BYTES`."""
    body = _Body(limit_s)
    try:
        chunks: Iterator[bytes] = response.iter_bytes()
        for chunk in chunks:
            body.add(chunk)
    except httpx.DecodingError as error:
        raise invalid_answer("the service's answer", f"undecodable body ({error})") from error
    finally:
        response.close()
    return body.response(response)


async def aread_whole(response: httpx.Response, limit_s: float) -> httpx.Response:
    """`read_whole` for an async response."""
    body = _Body(limit_s)
    try:
        chunks: AsyncIterator[bytes] = response.aiter_bytes()
        async for chunk in chunks:
            body.add(chunk)
    except httpx.DecodingError as error:
        raise invalid_answer("the service's answer", f"undecodable body ({error})") from error
    finally:
        await response.aclose()
    return body.response(response)


def check_action(action: list[float], card: ModelPublic | None) -> None:
    """Raise `InvalidResponseError` for an action that is not finite, or not of `card`'s length
    and within its bounds (`card` None: only finiteness is checked)."""
    if not all(math.isfinite(value) for value in action):
        raise InvalidResponseError(f"the service sent a non-finite action {action[:8]}")
    if card is None:
        return
    if len(action) != card.action_dim:
        raise InvalidResponseError(
            f"the service sent an action of {len(action)} values; model {card.name} has "
            f"{card.action_dim}"
        )
    for value, low, high in zip(action, card.action_low, card.action_high, strict=False):
        slack = BOUND_TOLERANCE * max(1.0, abs(low), abs(high))
        if not low - slack <= value <= high + slack:
            raise InvalidResponseError(
                f"the service sent an action {action[:8]} outside model {card.name}'s bounds "
                f"{card.action_low}..{card.action_high}"
            )


def check_answer(answer: Any, episode_id: str | None, cards: Mapping[str, ModelPublic]) -> None:
    """Raise `InvalidResponseError` when `answer` is about another episode than `episode_id`
    (None: any), or carries an action `check_action` refuses (against the card of the model it
    names, when `cards` has it)."""
    answered = getattr(answer, "episode_id", None)
    if episode_id is not None and answered is not None and answered != episode_id:
        raise InvalidResponseError(
            f"the service answered about episode {answered[:80]!r}, not {episode_id!r}"
        )
    if isinstance(answer, StepResponse):
        check_action(answer.action, cards.get(answer.model))
