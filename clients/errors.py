"""The clients' typed errors: one `PolicyClientError` subclass per kind of failure.

Every message is one line of at most `MAX_DETAIL` characters of the server's detail, whatever
the server sent (a hostile or broken server cannot put a traceback, a page of HTML or a megabyte
into a controller's log line), and never empty.
"""

from __future__ import annotations

import httpx
import pydantic

from clients.retry import parse_retry_after
from runtime.user_errors import one_line
from service.schemas import ErrorResponse

MAX_DETAIL = 500
"""Characters of a server's detail kept in an error's message."""


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


class InvalidResponseError(PolicyClientError):
    """The service's answer broke the API's contract: not JSON, missing or mistyped fields, an
    undecodable or oversized body, an action that is not finite or outside the model card's
    length and bounds, or an answer about another episode. Never retried."""


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
    detail = one_line(detail, MAX_DETAIL) or f"HTTP status {status_code} without detail"
    code = None if code is None else one_line(code, 100)
    field = None if field is None else one_line(field, 200)
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
        detail = one_line(response.text[: MAX_DETAIL * 2], MAX_DETAIL) or response.reason_phrase
        if 300 <= status < 400 and "Location" in response.headers:
            detail = f"redirected to {response.headers['Location']!r} (not followed)"
        return error_for_status(status, detail, retry_after=retry_after)
    return error_for_status(status, body.detail, body.code, body.field, retry_after)


def invalid_answer(what: str, error: pydantic.ValidationError | str) -> InvalidResponseError:
    """The error for an answer that broke the contract, naming its first problem in one line."""
    if isinstance(error, str):
        return InvalidResponseError(one_line(f"{what}: {error}", MAX_DETAIL))
    problems = error.errors()
    first = problems[0]
    where = ".".join(str(part) for part in first["loc"])
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    text = f"{what}: {where + ': ' if where else ''}{first['msg']}{more}"
    return InvalidResponseError(one_line(text, MAX_DETAIL), field=where or None)
