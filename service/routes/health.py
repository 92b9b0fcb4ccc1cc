"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from service.deps import EpisodeServiceDep, MetricsDep
from service.schemas import HealthStatus

router = APIRouter(tags=["health"])


@router.get("/livez")
async def livez() -> HealthStatus:
    """The process is up."""
    return HealthStatus(status="ok")


@router.get("/readyz", responses={503: {"model": HealthStatus}})
async def readyz(service: EpisodeServiceDep, response: Response) -> HealthStatus:
    """Models are loaded and the session store answers."""
    models = len(service.repository)
    store_ok = await run_in_threadpool(service.store.ping)
    if models and store_ok:
        return HealthStatus(status="ok", models=models)
    response.status_code = 503
    detail = "no model loaded" if not models else "session store unavailable"
    return HealthStatus(status="unavailable", models=models, detail=detail)


@router.get("/metrics", include_in_schema=False)
def metrics(metrics: MetricsDep) -> Response:
    """Prometheus metrics."""
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
