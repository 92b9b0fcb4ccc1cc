"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import math

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from service.config import Settings
from service.deps import EpisodeServiceDep, MetricsDep
from service.errors import RETRY_AFTER_HEADER
from service.repository import describe_refused
from service.schemas import HealthStatus, ReloadFailure
from service.stores.base import SessionStore

router = APIRouter(tags=["health"])


@router.get("/livez")
async def livez() -> HealthStatus:
    """The process is up."""
    return HealthStatus(status="ok")


@router.get("/readyz", responses={503: {"model": HealthStatus, "headers": RETRY_AFTER_HEADER}})
async def readyz(service: EpisodeServiceDep, response: Response) -> HealthStatus:
    """Models are loaded, the last reload refused none, and the session store answers."""
    models = len(service.repository)
    refused = service.repository.refused
    store_ok = await run_in_threadpool(service.store.ping)
    problems = readiness_problems(models, refused, store_ok)
    if not problems:
        return HealthStatus(status="ok", models=models)
    response.status_code = 503
    models_ok = bool(models) and not refused
    store_wait_s = store_retry_s(store_ok, service.store, service.settings)
    wait_s = not_ready_retry_after(models_ok, store_wait_s, service.settings)
    response.headers["Retry-After"] = str(wait_s)
    detail = "; ".join(problems)
    return HealthStatus(status="unavailable", models=models, detail=detail, refused=refused)


def readiness_problems(models: int, refused: list[ReloadFailure], store_ok: bool) -> list[str]:
    """Why this replica should get no traffic; empty when it is ready.

    A refused model fails readiness even while other models (or its old version) serve: a
    rollout with a broken file then stops at the first replica instead of shipping it.
    """
    problems = [] if models else ["no model loaded"]
    if refused:
        problems.append(describe_refused(refused))
    if not store_ok:
        problems.append("session store unavailable")
    return problems


def store_retry_s(store_ok: bool, store: SessionStore, settings: Settings) -> float:
    """Seconds until the store may answer again: 0 when it answered, the open breaker's
    remaining cool-down, else (a failure that has not opened the breaker yet) one probe
    interval, since the next call or probe may well get through."""
    if store_ok:
        return 0.0
    # read after the ping, which may have tripped the breaker
    return store.unavailable_for() or settings.redis_probe_interval_s


def not_ready_retry_after(models_ok: bool, store_wait_s: float, settings: Settings) -> int:
    """`Retry-After` of a 503 `/readyz`, in seconds.

    When the store is all that is wrong, `store_wait_s` (`store_retry_s`: the Redis breaker's
    remaining cool-down, or one probe interval before it opens) rounded up; otherwise
    `not_ready_retry_after_s`, or that wait when it is longer.
    """
    store_wait = math.ceil(store_wait_s)
    if models_ok and store_wait > 0:
        return store_wait
    return max(settings.not_ready_retry_after_s, store_wait)


@router.get("/metrics", include_in_schema=False)
def metrics(metrics: MetricsDep) -> Response:
    """Prometheus metrics."""
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
