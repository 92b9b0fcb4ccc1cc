"""FastAPI dependencies: the app's service objects, bearer-token auth and tenancy.

They are `async` on purpose: none of them blocks, and FastAPI runs a sync dependency in the
threadpool, which costs a thread hand-off per dependency per request.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, Header
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import HTTPConnection

from service.config import Settings
from service.episodes import EpisodeService
from service.errors import ForbiddenError, UnauthorizedError
from service.metrics import Metrics
from service.preconditions import Precondition, parse_if_match
from service.repository import ModelRepository
from service.schemas import MAX_UNIX_TIME

bearer_scheme = HTTPBearer(auto_error=False, description="one of the tokens in CDT_API_TOKENS")


async def get_service(connection: HTTPConnection) -> EpisodeService:
    """The app's episode service acting for the caller's principal (REST and websocket)."""
    service: EpisodeService = connection.app.state.service
    return service.for_owner(principal(connection, service.settings))


def principal(connection: HTTPConnection, settings: Settings) -> str:
    """Whose episodes a request sees: a digest of its token (not the token: it is stored), or ""
    for everyone when auth is off. The token itself is checked by `require_token`."""
    token = websocket_token(connection)
    if not settings.api_tokens or token is None:
        return ""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


async def get_settings(connection: HTTPConnection) -> Settings:
    """The app's settings."""
    settings: Settings = connection.app.state.settings
    return settings


async def get_repository(connection: HTTPConnection) -> ModelRepository:
    """The app's model repository."""
    service: EpisodeService = connection.app.state.service
    return service.repository


async def get_metrics(connection: HTTPConnection) -> Metrics:
    """The app's metrics."""
    service: EpisodeService = connection.app.state.service
    return service.metrics


async def get_precondition(
    if_match: Annotated[
        str | None,
        Header(description='the revision (ETag) the change was decided on, e.g. "7"'),
    ] = None,
    deadline: Annotated[
        float | None,
        Header(
            alias="X-Request-Deadline",
            gt=0.0,
            le=MAX_UNIX_TIME,
            allow_inf_nan=False,
            description="unix time (s) after which no replica applies the change",
        ),
    ] = None,
) -> Precondition | None:
    """A change's optional preconditions (`service.preconditions`), from its headers."""
    return Precondition.of(parse_if_match(if_match), deadline)


EpisodeServiceDep = Annotated[EpisodeService, Depends(get_service)]
PreconditionDep = Annotated[Precondition | None, Depends(get_precondition)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
RepositoryDep = Annotated[ModelRepository, Depends(get_repository)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]


def token_accepted(token: str | None, tokens: frozenset[str]) -> bool:
    """True when auth is off (no tokens configured) or `token` is one of `tokens`."""
    return not tokens or _listed(token, tokens)


def _listed(token: str | None, tokens: frozenset[str]) -> bool:
    if token is None:
        return False
    return any(hmac.compare_digest(token.encode(), known.encode()) for known in tokens)


async def require_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> None:
    """Reject REST requests without a valid bearer token (when tokens are configured)."""
    token = credentials.credentials if credentials is not None else None
    if not token_accepted(token, settings.api_tokens):
        raise UnauthorizedError("missing or invalid bearer token", "Authorization")


async def require_admin(connection: HTTPConnection, settings: SettingsDep) -> None:
    """Refuse /v1/admin/* to tokens outside `admin_tokens` (open when no token is configured)."""
    if settings.api_tokens and not _listed(websocket_token(connection), settings.admin_tokens):
        raise ForbiddenError("this token may not call /v1/admin/*", "Authorization")


def websocket_token(connection: HTTPConnection) -> str | None:
    """The bearer token of a websocket handshake: `Authorization` header or `?token=`."""
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token:
        return token.strip()
    return connection.query_params.get("token")
