"""REST routes of one episode's life: start, step, budget change, state, end.

The routes are `async` and await `EpisodeService`, whose `Inference` runs the work in turn
batches on the event loop or in batch threads (`service.inference`). A sync route would cost a
thread hand-off always (two, since FastAPI also validates a sync route's return value in the
threadpool).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from service.deps import EpisodeServiceDep
from service.errors import error_responses
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
BODY_ERRORS = error_responses(400, 413)  # undecodable body (FastAPI's 400), oversized body
EpisodeIdPath = Annotated[
    str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$", description="episode id")
]


@router.post("", status_code=201, responses=BODY_ERRORS | error_responses(429))
async def create_episode(body: EpisodeCreate, service: EpisodeServiceDep) -> StepResponse:
    """Start an episode with its first observation and targets; returns the first action."""
    with service.timed("rest", "start"):
        return await service.start(body, reply=StepResponse)


@router.post("/{episode_id}/step", responses=BODY_ERRORS | error_responses(409))
async def step_episode(
    episode_id: EpisodeIdPath, body: StepRequest, service: EpisodeServiceDep
) -> StepResponse:
    """Report the env's reward, cost and next observation; returns the next action."""
    with service.timed("rest", "step"):
        return await service.step(episode_id, body, reply=StepResponse)


@router.patch("/{episode_id}/budget", responses=BODY_ERRORS | error_responses(409))
async def update_budget(
    episode_id: EpisodeIdPath, body: BudgetUpdate, service: EpisodeServiceDep
) -> EpisodePublic:
    """Change the cost limit or reward target mid-episode (zero-shot threshold change)."""
    return await service.update_budget(episode_id, body)


@router.get("/{episode_id}", responses=error_responses(409))
async def get_episode(episode_id: EpisodeIdPath, service: EpisodeServiceDep) -> EpisodePublic:
    """State and totals of a live episode."""
    return await service.describe(episode_id)


@router.delete("/{episode_id}", responses=error_responses(409))
async def end_episode(episode_id: EpisodeIdPath, service: EpisodeServiceDep) -> EpisodeSummary:
    """End an episode; returns its steps, total reward and total cost."""
    return await service.end(episode_id)
