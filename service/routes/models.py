"""Model repository routes: list the served policies and reload them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from service.deps import MetricsDep, RepositoryDep
from service.errors import error_responses
from service.schemas import ModelList, ModelPublic, ReloadResult

router = APIRouter(tags=["models"])


@router.get("/models")
async def list_models(repository: RepositoryDep) -> ModelList:
    """The policies new episodes can start with, with dims, bounds and validated budgets."""
    return ModelList(models=[policy.card.to_public() for policy in repository.policies()])


@router.get("/models/{name}", responses=error_responses(404, 422))
async def get_model(
    name: Annotated[str, Path(min_length=1, max_length=128)], repository: RepositoryDep
) -> ModelPublic:
    """One served policy by name."""
    return repository.current(name).card.to_public()


@router.post("/admin/reload")
def reload_models(repository: RepositoryDep, metrics: MetricsDep) -> ReloadResult:
    """Rescan the model repository; broken files are refused and the old versions serve on."""
    result = repository.reload()
    metrics.models.set(len(repository))
    return result
