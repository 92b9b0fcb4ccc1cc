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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Self, SupportsFloat, TypeVar
from urllib.parse import quote

import httpx
import pydantic

from clients.retry import RetryPolicy, parse_retry_after
from service.schemas import (
    BudgetUpdate,
    EpisodeCreate,
    EpisodePublic,
    EpisodeSummary,
    ErrorResponse,
    HealthStatus,
    ModelList,
    ModelPublic,
    ReloadResult,
    StepRequest,
    StepResponse,
)

DEFAULT_URL = "http://127.0.0.1:8000"
ResponseT = TypeVar("ResponseT", bound=pydantic.BaseModel)
HttpT = TypeVar("HttpT", httpx.Client, httpx.AsyncClient)
Observation = Iterable[SupportsFloat]
Outcome = httpx.Response | httpx.TransportError


class PolicyClientError(Exception):
    """Base of the client's errors; carries the service's status, error code and field, and
    `retry_after`: the seconds the service asked to wait before retrying (None: no hint)."""

    def __init__(
        self,
        detail: str,
        *,
        status_code: int | None = None,
        code: str | None = None,
        field: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status_code} {code}: {detail}" if status_code else detail)
        self.detail, self.status_code, self.code, self.field = detail, status_code, code, field
        self.retry_after = retry_after


class ServiceUnreachableError(PolicyClientError):
    """Connection failure or timeout: no answer from the service."""


class InvalidRequestError(PolicyClientError):
    """The request was refused as invalid (400, 413, 422, or rejected before sending)."""


class AuthenticationError(PolicyClientError):
    """Missing or invalid bearer token (401)."""


class PermissionDeniedError(PolicyClientError):
    """A valid token without the right to this route, e.g. `/v1/admin/*` (403)."""


class NotFoundError(PolicyClientError):
    """Unknown episode or model (404)."""


class EpisodeGoneError(PolicyClientError):
    """The episode ended, expired, or its model version is no longer served (410)."""


class ConflictError(PolicyClientError):
    """Out-of-order step index (`step_out_of_order`), or the episode stayed busy with another
    request (`episode_busy`, retryable) (409)."""


class PreconditionFailedError(PolicyClientError):
    """Nothing was changed (412): the episode is no longer at the revision the call named
    (`revision_mismatch`), or the call's deadline passed before it applied (`deadline_passed`)."""


class TooManyEpisodesError(PolicyClientError):
    """The service's cap on live episodes is reached (429)."""


class ServerError(PolicyClientError):
    """The service failed (5xx)."""


_ERRORS_BY_STATUS: dict[int, type[PolicyClientError]] = {
    **dict.fromkeys((400, 413, 422), InvalidRequestError),
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    410: EpisodeGoneError,
    412: PreconditionFailedError,
    429: TooManyEpisodesError,
}


def error_for_status(
    status_code: int,
    detail: str,
    code: str | None = None,
    field: str | None = None,
    retry_after: float | None = None,
) -> PolicyClientError:
    """The `PolicyClientError` subclass for an HTTP status (also used for websocket errors)."""
    fallback = ServerError if status_code >= 500 else PolicyClientError
    error_type = _ERRORS_BY_STATUS.get(status_code, fallback)
    return error_type(
        detail, status_code=status_code, code=code, field=field, retry_after=retry_after
    )


def error_from_response(response: httpx.Response) -> PolicyClientError:
    """Build the error for a non-2xx response, from its `ErrorResponse` body when it has one."""
    status = response.status_code
    retry_after = parse_retry_after(response.headers.get("Retry-After"))
    try:
        body = ErrorResponse.model_validate_json(response.content)
    except pydantic.ValidationError:
        detail = response.text[:500] or response.reason_phrase
        return error_for_status(status, detail, retry_after=retry_after)
    return error_for_status(status, body.detail, body.code, body.field, retry_after)


@dataclass(frozen=True)
class _Call(Generic[ResponseT]):
    """One API call: method, path, JSON body, the type of the answer, whether it is repeatable
    (safe to send again even if a lost attempt went through: a numbered step), and for a change
    (a step or budget change, which may carry preconditions) the revision it requires."""

    method: str
    path: str
    response_type: type[ResponseT]
    body: dict[str, Any] | None = None
    repeatable: bool = False
    ok_statuses: frozenset[int] = frozenset({200, 201})
    change: bool = False
    revision: int | None = None


def _body(build: Callable[[], pydantic.BaseModel]) -> dict[str, Any]:
    """Validate a request body locally, so bad input fails before it is sent."""
    try:
        return build().model_dump(mode="json", exclude_none=True)
    except pydantic.ValidationError as error:
        field = ".".join(str(part) for part in error.errors()[0]["loc"])
        raise InvalidRequestError(str(error), field=field or None) from error


def _episode_path(episode_id: str, suffix: str = "") -> str:
    return f"/v1/episodes/{quote(episode_id, safe='')}{suffix}"


def _create_call(
    model: str,
    targets: tuple[float, float],
    observation: Observation,
    seed: int | None,
    modes: tuple[bool, bool],
    cut_floor: float | None = None,
) -> _Call[StepResponse]:
    """`modes`: (deterministic, budget_guard); a guard left on is not sent (the default)."""
    fields = {"model": model, "target_reward": targets[0], "target_cost": targets[1]}
    fields["seed"] = None if seed is None else int(seed)
    fields |= {"observation": [float(value) for value in observation], "deterministic": modes[0]}
    fields["budget_guard"] = None if modes[1] else False
    fields["cut_floor"] = cut_floor
    body = _body(lambda: EpisodeCreate.model_validate(fields))
    return _Call("POST", "/v1/episodes", StepResponse, body)


def _step_call(
    episode_id: str,
    observation: Observation,
    env_answer: tuple[float, float],
    step: int | None,
    revision: int | None,
) -> _Call[StepResponse]:
    """`env_answer`: the step's reward and cost."""
    values = [float(value) for value in observation]
    reward, cost = env_answer
    body = _body(lambda: StepRequest(observation=values, reward=reward, cost=cost, step=step))
    path = _episode_path(episode_id, "/step")
    repeatable = step is not None
    return _Call("POST", path, StepResponse, body, repeatable, change=True, revision=revision)


def _budget_call(
    episode_id: str, budgets: tuple[float | None, ...], revision: int | None
) -> _Call[EpisodePublic]:
    """`budgets`: cost_limit, remaining_cost, target_reward, remaining_reward."""
    names = ("cost_limit", "remaining_cost", "target_reward", "remaining_reward")
    body = _body(lambda: BudgetUpdate.model_validate(dict(zip(names, budgets, strict=True))))
    path = _episode_path(episode_id, "/budget")
    return _Call("PATCH", path, EpisodePublic, body, change=True, revision=revision)


_READYZ = _Call("GET", "/readyz", HealthStatus, ok_statuses=frozenset({200, 503}))
_MODELS = _Call("GET", "/v1/models", ModelList)
_RELOAD = _Call("POST", "/v1/admin/reload", ReloadResult)


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

    def _new_http(self, timeout: float | httpx.Timeout) -> HttpT:
        raise NotImplementedError

    def _build(self, call: _Call[Any]) -> httpx.Request:
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

    def _answer(self, call: _Call[ResponseT], attempt: int, outcome: Outcome) -> ResponseT | float:
        """The parsed answer, or the seconds to wait before sending `call` again (attempt
        `attempt`, 0 first, failed); raises once the call failed for good."""
        if isinstance(outcome, httpx.TransportError):
            wait = self.retry.after_failure(attempt, call.repeatable)
            if wait is None:
                detail = f"{call.method} {call.path}: {outcome!r}"
                raise ServiceUnreachableError(detail) from outcome
            return wait
        if outcome.status_code in call.ok_statuses:
            return call.response_type.model_validate_json(outcome.content)
        hint = parse_retry_after(outcome.headers.get("Retry-After"))
        wait = self.retry.after_refusal(attempt, outcome.status_code, hint, call.repeatable)
        if wait is None:
            raise error_from_response(outcome)
        return wait


class PolicyClient(_ClientBase[httpx.Client]):
    """Synchronous client; use it as a context manager (or call `close()`)."""

    def _new_http(self, timeout: float | httpx.Timeout) -> httpx.Client:
        return httpx.Client(timeout=timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool (unless it was passed in)."""
        if self._owns_http:
            self._http.close()

    def _send(self, call: _Call[ResponseT]) -> ResponseT:
        attempt = 0
        while True:
            try:
                outcome: Outcome = self._http.send(self._build(call))
            except httpx.TransportError as error:
                outcome = error
            answer = self._answer(call, attempt, outcome)
            if not isinstance(answer, float):
                return answer
            time.sleep(answer)
            attempt += 1

    def list_models(self) -> list[ModelPublic]:
        """`GET /v1/models`: the policies new episodes can start with."""
        return self._send(_MODELS).models

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
        call = _create_call(model, targets, observation, seed, modes, cut_floor)
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
        call = _step_call(episode_id, observation, (reward, cost), step, revision)
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
        return self._send(_budget_call(episode_id, budgets, revision))

    def get_episode(self, episode_id: str) -> EpisodePublic:
        """`GET /v1/episodes/{id}`: state and totals."""
        return self._send(_Call("GET", _episode_path(episode_id), EpisodePublic))

    def close_episode(self, episode_id: str) -> EpisodeSummary:
        """`DELETE /v1/episodes/{id}`: end the episode; returns its summary."""
        return self._send(_Call("DELETE", _episode_path(episode_id), EpisodeSummary))

    def readyz(self) -> HealthStatus:
        """`GET /readyz`; `status` is "unavailable" when the service is not ready."""
        return self._send(_READYZ)

    def reload_models(self) -> ReloadResult:
        """`POST /v1/admin/reload`: rescan the model repository."""
        return self._send(_RELOAD)


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

    async def _send(self, call: _Call[ResponseT]) -> ResponseT:
        attempt = 0
        while True:
            try:
                outcome: Outcome = await self._http.send(self._build(call))
            except httpx.TransportError as error:
                outcome = error
            answer = self._answer(call, attempt, outcome)
            if not isinstance(answer, float):
                return answer
            await asyncio.sleep(answer)
            attempt += 1

    async def list_models(self) -> list[ModelPublic]:
        """`GET /v1/models`: the policies new episodes can start with."""
        return (await self._send(_MODELS)).models

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
        call = _create_call(model, targets, observation, seed, modes, cut_floor)
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
        call = _step_call(episode_id, observation, (reward, cost), step, revision)
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
        return await self._send(_budget_call(episode_id, budgets, revision))

    async def get_episode(self, episode_id: str) -> EpisodePublic:
        """`GET /v1/episodes/{id}`: state and totals."""
        return await self._send(_Call("GET", _episode_path(episode_id), EpisodePublic))

    async def close_episode(self, episode_id: str) -> EpisodeSummary:
        """`DELETE /v1/episodes/{id}`: end the episode; returns its summary."""
        return await self._send(_Call("DELETE", _episode_path(episode_id), EpisodeSummary))

    async def readyz(self) -> HealthStatus:
        """`GET /readyz`; `status` is "unavailable" when the service is not ready."""
        return await self._send(_READYZ)

    async def reload_models(self) -> ReloadResult:
        """`POST /v1/admin/reload`: rescan the model repository."""
        return await self._send(_RELOAD)
