"""Typed Python client for the policy service's API v1 (httpx; sync and async).

One method per route, each returning a `service.schemas` model; every non-2xx answer raises a
`PolicyClientError` subclass. Retries follow `clients.retry.RetryPolicy`: a refusal with the
service's `Retry-After` (409 `episode_busy`, 429; 503 only for a numbered step) is sent again after
the time it names, and a numbered step `step(..., step=t)` also after a transport error or a
502/503/504, since the service answers a repeated step with the same action:
`with PolicyClient(url) as client: client.step(episode_id, observation, reward, cost, step=t)`.

A step or budget change may carry the episode's `revision` from an earlier answer (`If-Match`):
it then applies only if nothing changed the episode since, else `PreconditionFailedError`. With
`deadline_s`, each attempt of a step or budget change carries `X-Request-Deadline` (now plus
`deadline_s`), after which no replica applies it: with `deadline_s` at most the timeout, a call
that timed out can be sent elsewhere without the lost attempt applying later.

An answer that breaks the API's contract raises `InvalidResponseError` and is never retried: not
JSON, missing or mistyped fields, an undecodable body or one over `MAX_ANSWER_BYTES`, an answer
about another episode, an action that is not finite or (once `list_models` gave the model's card)
of the wrong length or outside its bounds. An answer's head (status line and headers), then its
body, must each arrive whole within the read timeout (one dripped a byte at a time is a
timeout; with an `http_client` of your own, the synchronous client bounds each read of the
head, not the whole); redirects are not followed.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Generic, Self, TypeVar

import httpx
import pydantic

from clients.answers import MAX_ANSWER_BYTES, aread_whole, check_answer, read_limit, read_whole
from clients.calls import (
    MODELS,
    READYZ,
    RELOAD,
    Call,
    Observation,
    ResponseT,
    budget_call,
    create_call,
    episode_path,
    step_call,
)
from clients.errors import (
    AuthenticationError,
    ConflictError,
    EpisodeGoneError,
    InvalidRequestError,
    InvalidResponseError,
    NotFoundError,
    PermissionDeniedError,
    PolicyClientError,
    PreconditionFailedError,
    ServerError,
    ServiceUnreachableError,
    TooManyEpisodesError,
    error_for_status,
    error_from_response,
    invalid_answer,
)
from clients.head_deadline import head_bounded_transport, head_limit
from clients.retry import RetryPolicy, parse_retry_after
from service.schemas import (
    EpisodePublic,
    EpisodeSummary,
    HealthStatus,
    ModelList,
    ModelPublic,
    ReloadResult,
    StepResponse,
)

DEFAULT_URL = "http://127.0.0.1:8000"
HttpT = TypeVar("HttpT", httpx.Client, httpx.AsyncClient)
Outcome = httpx.Response | httpx.TransportError
__all__ = [  # errors from clients.errors, re-exported: importing them from here keeps working
    "DEFAULT_URL",
    "MAX_ANSWER_BYTES",
    "AsyncPolicyClient",
    "AuthenticationError",
    "ConflictError",
    "EpisodeGoneError",
    "InvalidRequestError",
    "InvalidResponseError",
    "NotFoundError",
    "Observation",
    "PermissionDeniedError",
    "PolicyClient",
    "PolicyClientError",
    "PreconditionFailedError",
    "ServerError",
    "ServiceUnreachableError",
    "TooManyEpisodesError",
    "error_for_status",
    "error_from_response",
]


class _ClientBase(Generic[HttpT]):
    """Construction, retry policy and answer parsing shared by both clients.

    Args:
        base_url: the service, e.g. `http://127.0.0.1:8000`.
        token: bearer token, when the service requires one.
        timeout: seconds (or an `httpx.Timeout`) for connect, read, write and pool.
        retry: which calls are sent again, how often and after how long (default
            `RetryPolicy()`: 2 retries, server hints up to 5 s).
        http_client: an existing httpx client to use (not closed by this client).
        deadline_s: each attempt of a step or budget change must apply within this many
            seconds of being sent, or never (`X-Request-Deadline`; the clocks of client and
            store must agree to well within it). None: no deadline.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float | httpx.Timeout = 10.0,
        retry: RetryPolicy | None = None,
        http_client: HttpT | None = None,
        deadline_s: float | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.retry = retry if retry is not None else RetryPolicy()
        self.deadline_s = deadline_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._owns_http = http_client is None
        self._http: HttpT = http_client if http_client is not None else self._new_http(timeout)
        self._body_s = read_limit(timeout if http_client is None else self._http.timeout)
        self.cards: dict[str, ModelPublic] = {}
        """The model cards `list_models` last returned: actions are checked against them."""

    def _new_http(self, timeout: float | httpx.Timeout) -> HttpT:
        raise NotImplementedError

    def _build(self, call: Call[Any]) -> httpx.Request:
        url = self.base_url + call.path
        headers = self._headers
        if call.change:  # built per attempt: each carries its own deadline
            headers = headers | self._preconditions(call.revision)
        return self._http.build_request(call.method, url, json=call.body, headers=headers)

    def _preconditions(self, revision: int | None) -> dict[str, str]:
        """The headers of a change's preconditions: the revision it requires, its deadline."""
        headers = {} if revision is None else {"If-Match": f'"{revision}"'}
        if self.deadline_s is not None:
            headers["X-Request-Deadline"] = f"{time.time() + self.deadline_s:.6f}"
        return headers

    def _answer(self, call: Call[ResponseT], attempt: int, outcome: Outcome) -> ResponseT | float:
        """The parsed answer, or the seconds to wait before sending `call` again (attempt
        `attempt`, 0 first, failed); raises once the call failed for good."""
        if isinstance(outcome, httpx.TransportError):
            wait = self.retry.after_failure(attempt, call.repeatable)
            if wait is None:
                detail = f"{call.method} {call.path}: {outcome!r}"
                raise ServiceUnreachableError(detail) from outcome
            return wait
        if outcome.status_code in call.ok_statuses:
            return self._parse(call, outcome)
        hint = parse_retry_after(outcome.headers.get("Retry-After"))
        wait = self.retry.after_refusal(attempt, outcome.status_code, hint, call.repeatable)
        if wait is None:
            raise error_from_response(outcome)
        return wait

    def _parse(self, call: Call[ResponseT], response: httpx.Response) -> ResponseT:
        """The answer as `call.response_type`, checked (`clients.answers.check_answer`)."""
        what = f"the answer to {call.method} {call.path}"
        try:
            answer = call.response_type.model_validate_json(response.content)
        except pydantic.ValidationError as error:
            raise invalid_answer(what, error) from None
        check_answer(answer, call.episode, self.cards)
        if isinstance(answer, ModelList):
            self.cards = {card.name: card for card in answer.models}
        return answer


class PolicyClient(_ClientBase[httpx.Client]):
    """Synchronous client; use it as a context manager (or call `close()`)."""

    def _new_http(self, timeout: float | httpx.Timeout) -> httpx.Client:
        return httpx.Client(timeout=timeout, transport=head_bounded_transport())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool (unless it was passed in)."""
        if self._owns_http:
            self._http.close()

    def _send(self, call: Call[ResponseT]) -> ResponseT:
        attempt = 0
        while True:
            request = self._build(call)
            try:
                with head_limit(self._body_s):  # a head dripped a byte per read is a timeout
                    streamed = self._http.send(request, stream=True)
                outcome: Outcome = read_whole(streamed, self._body_s)
            except httpx.TransportError as error:
                outcome = error
            except httpx.InvalidURL as error:  # a redirect's Location (the request's is ours)
                raise invalid_answer(f"{call.method} {call.path}", str(error)) from error
            answer = self._answer(call, attempt, outcome)
            if not isinstance(answer, float):
                return answer
            time.sleep(answer)
            attempt += 1

    def list_models(self) -> list[ModelPublic]:
        """`GET /v1/models`: the policies new episodes can start with."""
        return self._send(MODELS).models

    def create_episode(
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
        """`POST /v1/episodes`: start an episode; returns action 0 (`budget_guard=False`: the
        server's budget guard stays off for it; `cut_floor`: the lowest budget it may be cut to,
        for the guard to keep ready)."""
        modes = (deterministic, budget_guard)
        targets = (target_reward, target_cost)
        call = create_call(model, targets, observation, seed, modes, cut_floor)
        return self._send(call)

    def step(
        self,
        episode_id: str,
        observation: Observation,
        reward: float,
        cost: float,
        *,
        step: int | None = None,
        revision: int | None = None,
    ) -> StepResponse:
        """`POST /v1/episodes/{id}/step`; with `step` (this observation's index) it is
        repeatable, so it is also retried when no answer came back. With `revision` (an
        earlier answer's) it applies only if the episode is still at that revision."""
        call = step_call(episode_id, observation, (reward, cost), step, revision)
        return self._send(call)

    def update_budget(
        self,
        episode_id: str,
        *,
        cost_limit: float | None = None,
        remaining_cost: float | None = None,
        target_reward: float | None = None,
        remaining_reward: float | None = None,
        revision: int | None = None,
    ) -> EpisodePublic:
        """`PATCH /v1/episodes/{id}/budget`: change the cost limit or reward target (with
        `revision`, only if the episode is still at that revision)."""
        budgets = (cost_limit, remaining_cost, target_reward, remaining_reward)
        return self._send(budget_call(episode_id, budgets, revision))

    def get_episode(self, episode_id: str) -> EpisodePublic:
        """`GET /v1/episodes/{id}`: state and totals."""
        call = Call("GET", episode_path(episode_id), EpisodePublic, episode=episode_id)
        return self._send(call)

    def close_episode(self, episode_id: str) -> EpisodeSummary:
        """`DELETE /v1/episodes/{id}`: end the episode; returns its summary."""
        call = Call("DELETE", episode_path(episode_id), EpisodeSummary, episode=episode_id)
        return self._send(call)

    def readyz(self) -> HealthStatus:
        """`GET /readyz`; `status` is "unavailable" when the service is not ready."""
        return self._send(READYZ)

    def reload_models(self) -> ReloadResult:
        """`POST /v1/admin/reload`: rescan the model repository."""
        return self._send(RELOAD)


class AsyncPolicyClient(_ClientBase[httpx.AsyncClient]):
    """Asynchronous client; use it as an async context manager (or call `aclose()`)."""

    def _new_http(self, timeout: float | httpx.Timeout) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool (unless it was passed in)."""
        if self._owns_http:
            await self._http.aclose()

    @property
    def _head_s(self) -> float | None:
        """Seconds an answer's head may take after sending: the read timeout (None: no limit)."""
        return None if math.isinf(self._body_s) else self._body_s

    async def _send(self, call: Call[ResponseT]) -> ResponseT:
        attempt = 0
        while True:
            request = self._build(call)
            try:
                streamed = await asyncio.wait_for(
                    self._http.send(request, stream=True), self._head_s
                )
                outcome: Outcome = await aread_whole(streamed, self._body_s)
            except TimeoutError:  # a head dripped a byte per read never trips a read timeout
                outcome = httpx.ReadTimeout(
                    f"no answer's head within {self._head_s:g} s", request=request
                )
            except httpx.TransportError as error:
                outcome = error
            except httpx.InvalidURL as error:  # a redirect's Location (the request's is ours)
                raise invalid_answer(f"{call.method} {call.path}", str(error)) from error
            answer = self._answer(call, attempt, outcome)
            if not isinstance(answer, float):
                return answer
            await asyncio.sleep(answer)
            attempt += 1

    async def list_models(self) -> list[ModelPublic]:
        """`GET /v1/models`: the policies new episodes can start with."""
        return (await self._send(MODELS)).models

    async def create_episode(
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
        """`POST /v1/episodes`: start an episode; returns action 0 (`budget_guard=False`: the
        server's budget guard stays off for it; `cut_floor`: the lowest budget it may be cut to,
        for the guard to keep ready)."""
        modes = (deterministic, budget_guard)
        targets = (target_reward, target_cost)
        call = create_call(model, targets, observation, seed, modes, cut_floor)
        return await self._send(call)

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
        """`POST /v1/episodes/{id}/step`; with `step` (this observation's index) it is
        repeatable, so it is also retried when no answer came back. With `revision` (an
        earlier answer's) it applies only if the episode is still at that revision."""
        call = step_call(episode_id, observation, (reward, cost), step, revision)
        return await self._send(call)

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
        """`PATCH /v1/episodes/{id}/budget`: change the cost limit or reward target (with
        `revision`, only if the episode is still at that revision)."""
        budgets = (cost_limit, remaining_cost, target_reward, remaining_reward)
        return await self._send(budget_call(episode_id, budgets, revision))

    async def get_episode(self, episode_id: str) -> EpisodePublic:
        """`GET /v1/episodes/{id}`: state and totals."""
        call = Call("GET", episode_path(episode_id), EpisodePublic, episode=episode_id)
        return await self._send(call)

    async def close_episode(self, episode_id: str) -> EpisodeSummary:
        """`DELETE /v1/episodes/{id}`: end the episode; returns its summary."""
        call = Call("DELETE", episode_path(episode_id), EpisodeSummary, episode=episode_id)
        return await self._send(call)

    async def readyz(self) -> HealthStatus:
        """`GET /readyz`; `status` is "unavailable" when the service is not ready."""
        return await self._send(READYZ)

    async def reload_models(self) -> ReloadResult:
        """`POST /v1/admin/reload`: rescan the model repository."""
        return await self._send(RELOAD)
