"""The API calls the REST clients send: method, path, validated body, expected answer type.

Request bodies are validated here, before anything is sent (`InvalidRequestError`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, SupportsFloat, TypeVar
from urllib.parse import quote

import pydantic

from clients.errors import InvalidRequestError
from service.schemas import (
    BudgetUpdate,
    EpisodeCreate,
    EpisodePublic,
    HealthStatus,
    ModelList,
    ReloadResult,
    StepRequest,
    StepResponse,
)

ResponseT = TypeVar("ResponseT", bound=pydantic.BaseModel)
Observation = Iterable[SupportsFloat]


@dataclass(frozen=True)
class Call(Generic[ResponseT]):
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
    episode: str | None = None
    """The episode the answer must be about (None: any)."""


def validated_body(build: Callable[[], pydantic.BaseModel]) -> dict[str, Any]:
    """Validate a request body locally, so bad input fails before it is sent."""
    try:
        return build().model_dump(mode="json", exclude_none=True)
    except pydantic.ValidationError as error:
        field = ".".join(str(part) for part in error.errors()[0]["loc"])
        raise InvalidRequestError(str(error), field=field or None) from error


def episode_path(episode_id: str, suffix: str = "") -> str:
    return f"/v1/episodes/{quote(episode_id, safe='')}{suffix}"


def create_call(
    model: str,
    targets: tuple[float, float],
    observation: Observation,
    seed: int | None,
    modes: tuple[bool, bool],
    cut_floor: float | None = None,
) -> Call[StepResponse]:
    """`modes`: (deterministic, budget_guard); a guard left on is not sent (the default)."""
    fields = {"model": model, "target_reward": targets[0], "target_cost": targets[1]}
    fields["seed"] = None if seed is None else int(seed)
    fields |= {"observation": [float(value) for value in observation], "deterministic": modes[0]}
    fields["budget_guard"] = None if modes[1] else False
    fields["cut_floor"] = cut_floor
    body = validated_body(lambda: EpisodeCreate.model_validate(fields))
    return Call("POST", "/v1/episodes", StepResponse, body)


def step_call(
    episode_id: str,
    observation: Observation,
    env_answer: tuple[float, float],
    step: int | None,
    revision: int | None,
) -> Call[StepResponse]:
    """`env_answer`: the step's reward and cost."""
    values = [float(value) for value in observation]
    reward, cost = env_answer
    body = validated_body(
        lambda: StepRequest(observation=values, reward=reward, cost=cost, step=step)
    )
    path = episode_path(episode_id, "/step")
    repeatable = step is not None
    return Call(
        "POST", path, StepResponse, body, repeatable, change=True, revision=revision,
        episode=episode_id,
    )  # fmt: skip


def budget_call(
    episode_id: str, budgets: tuple[float | None, ...], revision: int | None
) -> Call[EpisodePublic]:
    """`budgets`: cost_limit, remaining_cost, target_reward, remaining_reward."""
    names = ("cost_limit", "remaining_cost", "target_reward", "remaining_reward")
    body = validated_body(
        lambda: BudgetUpdate.model_validate(dict(zip(names, budgets, strict=True)))
    )
    path = episode_path(episode_id, "/budget")
    return Call(
        "PATCH", path, EpisodePublic, body, change=True, revision=revision, episode=episode_id
    )


READYZ = Call("GET", "/readyz", HealthStatus, ok_statuses=frozenset({200, 503}))
MODELS = Call("GET", "/v1/models", ModelList)
RELOAD = Call("POST", "/v1/admin/reload", ReloadResult)
