"""Model repository routes: list the served policies and reload them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response
from fastapi.responses import JSONResponse

from service.deps import MetricsDep, RepositoryDep, require_admin
from service.errors import error_responses
from service.repository import describe_refused, public_card
from service.schemas import ModelList, ModelPublic, ReloadRefused, ReloadResult

router = APIRouter(tags=["models"])


@router.get("/models")
async def list_models(repository: RepositoryDep) -> ModelList:
    """The policies new episodes can start with, with dims, bounds and validated budgets."""
    return ModelList(models=[public_card(policy.card) for policy in repository.policies()])


@router.get("/models/{name}", responses=error_responses(404, 422))
async def get_model(
    name: Annotated[str, Path(min_length=1, max_length=128)], repository: RepositoryDep
) -> ModelPublic:
    """One served policy by name."""
    return public_card(repository.current(name).card)


@router.post(
    "/admin/reload",
    response_model=ReloadResult,
    responses=error_responses(403) | {422: {"model": ReloadRefused}},
    dependencies=[Depends(require_admin)],
)
def reload_models(repository: RepositoryDep, metrics: MetricsDep) -> ReloadResult | Response:
    """Rescan the model repository; broken files are refused and the old versions serve on.

    Any refused folder makes the answer 422 `models_refused`, with the same outcome fields, so
    a deploy script notices; `/readyz` reports the refusals until a reload loads them.
    """
    result = repository.reload()
    metrics.models.set(len(repository))
    if not result.failed:
        return result
    refused = ReloadRefused(**result.model_dump(), detail=describe_refused(result.failed))
    metrics.errors.labels(refused.code).inc()
    return JSONResponse(refused.model_dump(), status_code=422)
