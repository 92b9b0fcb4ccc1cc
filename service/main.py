"""The FastAPI app: `uvicorn service.main:create_app --factory` (or `cdt serve`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.body_errors import BODY_PARSE_FAILURE, clearer_errors, unreadable_body
from service.config import Settings
from service.deps import require_token, token_accepted
from service.episodes import EpisodeService
from service.errors import ServiceError, error_responses
from service.inference import Inference
from service.log_redaction import install_token_redaction
from service.metrics import Metrics
from service.repository import ModelRepository
from service.routes import episodes, health, models, stream
from service.routes.stream import describe_validation_error
from service.schemas import ErrorResponse
from service.stores.base import SessionStore
from service.stores.memory import InMemorySessionStore
from service.stores.redis import RedisSessionStore

logger = logging.getLogger(__name__)
API_VERSION = "1.0.0"
REQUEST_PARTS = frozenset({"body", "path", "query", "header", "cookie"})


def create_app(settings: Settings | None = None, *, store: SessionStore | None = None) -> FastAPI:
    """Build the app; models load and the store connects when the lifespan starts.

    Args:
        settings: defaults to `Settings()` (environment variables `CDT_*`).
        store: a session store to use instead of the one the settings describe (tests).
    """
    settings = settings if settings is not None else Settings()
    install_token_redaction()  # uvicorn logs handshake query strings (`?token=`)
    app = FastAPI(
        title="CDT policy service",
        summary="Constrained Decision Transformer policies with per-episode reward/cost budgets",
        version=API_VERSION,
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.injected_store = store
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes)
    gated = gated_paths(app, settings)
    if gated:
        app.add_middleware(TokenGateMiddleware, paths=gated, tokens=settings.api_tokens)
    app.add_exception_handler(ServiceError, _service_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.include_router(health.router)
    # auth (and its OpenAPI security scheme) only when tokens are configured, so the schema
    # says exactly what the server enforces; the websocket checks its token itself
    auth = [Depends(require_token)] if settings.api_tokens else []
    for router in (models.router, episodes.router):
        app.include_router(router, prefix="/v1", dependencies=auth, responses=auth_responses(auth))
    app.include_router(stream.router, prefix="/v1")
    return app


def gated_paths(app: FastAPI, settings: Settings) -> frozenset[str]:
    """The paths outside /v1 that need a token: with tokens configured, `/metrics` unless
    `public_metrics` and the OpenAPI pages unless `public_docs`; none without tokens."""
    if not settings.api_tokens:
        return frozenset()
    paths = set() if settings.public_metrics else {"/metrics"}
    if not settings.public_docs:
        docs = (app.docs_url, app.redoc_url, app.openapi_url, app.swagger_ui_oauth2_redirect_url)
        paths |= {path for path in docs if path}
    return frozenset(paths)


def auth_responses(auth: list[Any]) -> dict[int | str, dict[str, Any]]:
    """Document 401 on the routes that require a token."""
    return error_responses(401) if auth else {}


def make_store(settings: Settings, metrics: Metrics) -> SessionStore:
    """Redis when `redis_url` is set, the in-memory store otherwise."""
    store: SessionStore
    if settings.redis_url:
        store = RedisSessionStore.from_settings(settings.redis_url, settings)
    else:
        store = InMemorySessionStore.from_settings(settings)
    store.on_evict = metrics.record_evictions
    return store


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Load the model repository, connect the store, install the SIGHUP reload."""
    settings: Settings = app.state.settings
    metrics = Metrics()
    repository = ModelRepository(
        settings.models_dir,
        intra_op_threads=settings.intra_op_threads,
        inter_op_threads=settings.inter_op_threads,
        keep_versions=settings.keep_versions,
    )
    result = repository.reload()
    if not len(repository):
        refused = len(result.failed)
        logger.warning("no model served from %s (%d refused)", settings.models_dir, refused)
    metrics.models.set(len(repository))
    store = app.state.injected_store or make_store(settings, metrics)
    store.on_evict = metrics.record_evictions
    store.on_call = metrics.record_store_call
    metrics.track_store(store.unavailable_for)
    metrics.track_active_episodes(lambda: _count_or_nan(store))
    inference = Inference(store, metrics, settings)
    app.state.service = EpisodeService(repository, store, metrics, settings, inference=inference)
    reload_on_sighup = _install_sighup(repository, metrics)
    try:
        yield
    finally:
        reload_on_sighup()
        inference.close()
        if app.state.injected_store is None:
            store.close()


def _count_or_nan(store: SessionStore) -> float:
    try:
        return store.count()
    except ServiceError:
        return float("nan")


def _install_sighup(repository: ModelRepository, metrics: Metrics) -> Callable[[], None]:
    """Reload the repository on SIGHUP (main thread only); returns the uninstaller."""
    loop = asyncio.get_running_loop()

    def reload() -> None:
        logger.info("SIGHUP: reloading the model repository")
        future = loop.run_in_executor(None, repository.reload)
        future.add_done_callback(lambda _: metrics.models.set(len(repository)))

    try:
        loop.add_signal_handler(signal.SIGHUP, reload)
    except (NotImplementedError, RuntimeError, ValueError, AttributeError):
        return lambda: None  # not the main thread (TestClient) or no SIGHUP on this platform

    def uninstall() -> None:
        loop.remove_signal_handler(signal.SIGHUP)

    return uninstall


def _error_response(
    request: Request,
    status_code: int,
    body: ErrorResponse,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    with contextlib.suppress(AttributeError):
        request.app.state.service.metrics.errors.labels(body.code).inc()
    return JSONResponse(body.model_dump(), status_code=status_code, headers=headers)


async def _service_error(request: Request, error: ServiceError) -> JSONResponse:
    body = ErrorResponse(code=error.code, detail=error.detail, field=error.field)
    return _error_response(request, error.status_code, body, error.headers())


async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    errors = clearer_errors(error.errors(), request.headers.get("content-type"))
    field, detail = describe_validation_error(errors, REQUEST_PARTS, whole="body")
    body = ErrorResponse(code="validation_error", detail=detail, field=field)
    return _error_response(request, 422, body)


async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    if error.status_code == 400 and error.detail == BODY_PARSE_FAILURE:  # `service.body_errors`
        detail = unreadable_body(error.__cause__)
        body = ErrorResponse(code="validation_error", detail=f"body: {detail}", field="body")
        return _error_response(request, 422, body)
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code, "http_error")
    detail, headers = str(error.detail), dict(error.headers or {})
    path = request.url.path[:200]
    if error.status_code == 404 and detail == "Not Found":  # Starlette's: no route matched
        detail = f"no route {request.method} {path}; the API's routes are listed at /docs"
    if error.status_code == 405:  # Starlette lists only the first matching route's methods
        headers["Allow"] = ", ".join(sorted(allowed_methods(request)))
        detail = f"{request.method} is not allowed on {path}; allowed: {headers['Allow']}"
    body = ErrorResponse(code=code, detail=detail)
    return _error_response(request, error.status_code, body, headers)


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> set[str]:
    """Every method some route serves at this path: those a route matches fully. (Asked route
    by route, as the router does: FastAPI nests included routers in routes that have no
    `methods`, so reading `route.methods` found none there and `Allow` came out empty.)"""
    return {
        method
        for method in HTTP_METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL
            for route in request.app.routes
        )
    }


class TokenGateMiddleware:
    """Answer 401 to requests for `paths` without one of `tokens` as bearer token (the routes
    outside /v1 that `gated_paths` closes: metrics and the OpenAPI pages)."""

    def __init__(self, app: ASGIApp, paths: frozenset[str], tokens: frozenset[str]) -> None:
        self.app = app
        self.paths = paths
        self.tokens = tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and token_accepted(token.strip(), self.tokens):
            await self.app(scope, receive, send)
            return
        with contextlib.suppress(AttributeError):
            scope["app"].state.service.metrics.errors.labels("unauthorized").inc()
        body = ErrorResponse(
            code="unauthorized", detail="missing or invalid bearer token", field="Authorization"
        )
        headers = {"WWW-Authenticate": "Bearer"}
        await JSONResponse(body.model_dump(), status_code=401, headers=headers)(
            scope, receive, send
        )


class BodySizeLimitMiddleware:
    """Answer 413 to request bodies over `max_bytes`, declared or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        body, complete = b"", False
        while not complete:  # buffer the (small) body so a streamed one is measured too
            message = await receive()
            if message["type"] != "http.request":
                return  # the client disconnected
            body += message.get("body", b"")
            complete = not message.get("more_body", False)
            if len(body) > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
        await self.app(scope, _replay(body, receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"request body exceeds {self.max_bytes} bytes"
        body = ErrorResponse(code="payload_too_large", detail=detail, field="body")
        await JSONResponse(body.model_dump(), status_code=413)(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields the buffered body once, then defers to the real one."""
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
