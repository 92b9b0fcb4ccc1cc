"""REST routes of one episode's life: start, step, budget change, state, end.

The routes are `async` and await `EpisodeService`, whose `Inference` runs the work in turn
batches on the event loop or in batch threads (`service.inference`). A sync route would cost a
thread hand-off always (two, since FastAPI also validates a sync route's return value in the
threadpool).
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from fastapi import APIRouter, Path, Response

from service.deps import EpisodeServiceDep, PreconditionDep
from service.errors import error_responses
from service.preconditions import etag
from service.schemas import (
    BudgetUpdate,
    EpisodeCreate,
    EpisodePublic,
    EpisodeSummary,
    StepRequest,
    StepResponse,
)

router = APIRouter(
    prefix="/episodes", tags=["episodes"], responses=error_responses(404, 410, 422, 503)
)
BODY_ERRORS = error_responses(413)  # oversized body; an unreadable one is 422 (service.body_errors)
EpisodeIdPath = Annotated[
    str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="episode id")
]
CHANGE_ERRORS = BODY_ERRORS | error_responses(409, 412)  # 412: If-Match or deadline unmet
Answer = TypeVar("Answer", StepResponse, EpisodePublic)


def tagged(response: Response, answer: Answer) -> Answer:
    """`answer`, its revision sent as the `ETag` (what a later change's `If-Match` names)."""
    if answer.revision is not None:
        response.headers["ETag"] = etag(answer.revision)
    return answer


@router.post("", status_code=201, responses=BODY_ERRORS | error_responses(429))
async def create_episode(
    body: EpisodeCreate, service: EpisodeServiceDep, response: Response
) -> StepResponse:
    """Start an episode with its first observation and targets; returns the first action."""
    with service.timed("rest", "start"):
        return tagged(response, await service.start(body, reply=StepResponse))


@router.post("/{episode_id}/step", responses=CHANGE_ERRORS)
async def step_episode(
    episode_id: EpisodeIdPath,
    body: StepRequest,
    service: EpisodeServiceDep,
    precondition: PreconditionDep,
    response: Response,
) -> StepResponse:
    """Report the env's reward, cost and next observation; returns the next action."""
    with service.timed("rest", "step"):
        answer = await service.step(episode_id, body, reply=StepResponse, precondition=precondition)
    return tagged(response, answer)


@router.patch("/{episode_id}/budget", responses=CHANGE_ERRORS)
async def update_budget(
    episode_id: EpisodeIdPath,
    body: BudgetUpdate,
    service: EpisodeServiceDep,
    precondition: PreconditionDep,
    response: Response,
) -> EpisodePublic:
    """Change the cost limit or reward target mid-episode (zero-shot threshold change)."""
    return tagged(response, await service.update_budget(episode_id, body, precondition))


@router.get("/{episode_id}", responses=error_responses(409))
async def get_episode(
    episode_id: EpisodeIdPath, service: EpisodeServiceDep, response: Response
) -> EpisodePublic:
    """State and totals of a live episode."""
    return tagged(response, await service.describe(episode_id))


@router.delete("/{episode_id}", responses=error_responses(409))
async def end_episode(episode_id: EpisodeIdPath, service: EpisodeServiceDep) -> EpisodeSummary:
    """End an episode; returns its steps, total reward and total cost."""
    return await service.end(episode_id)
