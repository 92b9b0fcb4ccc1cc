"""Service errors: each maps to one HTTP status, one error code and (optionally) a field.

REST answers them as `ErrorResponse` JSON; the websocket answers them as `error` frames.
"""

from __future__ import annotations

from typing import Any

from service.schemas import ErrorResponse


class ServiceError(Exception):
    """Base of the errors the API reports to clients."""

    status_code = 500
    code = "internal_error"
    retry_after: int | None = None
    """Seconds a client should wait before retrying (`Retry-After`); None: not retryable."""

    def __init__(
        self, detail: str, field: str | None = None, *, retry_after: int | None = None
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.field = field
        if retry_after is not None:
            self.retry_after = retry_after

    def headers(self) -> dict[str, str]:
        """HTTP headers of the error answer: `WWW-Authenticate` on 401, `Retry-After`."""
        headers = {"WWW-Authenticate": "Bearer"} if self.status_code == 401 else {}
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return headers


class InvalidInputError(ServiceError):
    """A well-formed request that does not fit the model or the episode (422)."""

    status_code = 422
    code = "invalid_input"


class ModelNotFoundError(ServiceError):
    """No served model has this name (404)."""

    status_code = 404
    code = "model_not_found"


class EpisodeNotFoundError(ServiceError):
    """No episode has this id (404)."""

    status_code = 404
    code = "episode_not_found"


class EpisodeGoneError(ServiceError):
    """The episode ended, expired, or its model version is no longer served (410)."""

    status_code = 410
    code = "episode_gone"


class VersionElsewhereError(ServiceError):
    """The episode's model version was never loaded on this replica (503, retryable): another
    replica serves it, as while a deploy rolls out; one that no replica serves expires."""

    status_code = 503
    code = "model_version_unavailable"
    retry_after = 1


class StepOutOfOrderError(ServiceError):
    """The step index is neither the next step nor a retry of the last one (409): the client's
    step count is wrong, so retrying the same request cannot succeed."""

    status_code = 409
    code = "step_out_of_order"


class StepConflictError(ServiceError):
    """The step index repeats the last step with another observation (409): a retry must resend
    the same step, and a new step needs the next index; retrying the same request cannot
    succeed."""

    status_code = 409
    code = "step_conflict"


class RevisionMismatchError(ServiceError):
    """The change was decided on another revision of the episode than the stored one (412):
    nothing was changed; read the episode again before deciding. `revision` is the stored one
    (REST: also the answer's `ETag`; `service.preconditions`)."""

    status_code = 412
    code = "revision_mismatch"

    def __init__(self, detail: str, *, revision: int) -> None:
        super().__init__(detail, "revision")
        self.revision = revision

    def headers(self) -> dict[str, str]:
        """`ETag`: the stored revision, as `service.preconditions.etag` writes it."""
        return {"ETag": f'"{self.revision}"'}


class DeadlinePassedError(ServiceError):
    """The request's deadline passed before it could be applied (412): nothing was changed."""

    status_code = 412
    code = "deadline_passed"


class EpisodeBusyError(ServiceError):
    """Another request held the episode for longer than the lock wait (409, retryable)."""

    status_code = 409
    code = "episode_busy"
    retry_after = 1


class TooManyEpisodesError(ServiceError):
    """The cap on live episodes is reached (429)."""

    status_code = 429
    code = "too_many_episodes"
    retry_after = 1


class EpisodeQuotaError(TooManyEpisodesError):
    """This token holds its quota of live episodes (429)."""

    code = "episode_quota_exceeded"


class SocketEpisodeLimitError(ServiceError):
    """This websocket holds its limit of live episodes it started (429); it must end one first,
    so no `Retry-After`."""

    status_code = 429
    code = "socket_episode_limit"


class ForbiddenError(ServiceError):
    """A valid token without the right to this route (403)."""

    status_code = 403
    code = "forbidden"


class UnauthorizedError(ServiceError):
    """Missing or invalid bearer token (401)."""

    status_code = 401
    code = "unauthorized"


class StoreUnavailableError(ServiceError):
    """The session store cannot be reached (503)."""

    status_code = 503
    code = "store_unavailable"
    retry_after = 1


class RecordFormatError(ServiceError):
    """A stored episode record this replica cannot read: written by a replica of another
    version (another record format) or corrupted (500); the episode is left as it is."""

    status_code = 500
    code = "record_format"


class ModelError(ServiceError):
    """onnxruntime failed on this episode's window (500); nothing was changed."""

    status_code = 500
    code = "model_error"


class PolicyOutputError(ServiceError):
    """The model produced a non-finite action for these inputs (422); nothing was changed."""

    status_code = 422
    code = "non_finite_action"


RETRY_AFTER_HEADER: dict[str, Any] = {
    "Retry-After": {
        "description": "seconds to wait before trying again (a 409 carries it only for "
        "episode_busy)",
        "schema": {"type": "integer", "minimum": 1},
    }
}
"""OpenAPI `headers` entry of the answers that may carry `Retry-After`."""
RETRYABLE_STATUSES = frozenset({409, 429, 503})


def error_responses(*status_codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries documenting `ErrorResponse` (and `Retry-After`, where it
    may come) for these status codes."""
    return {
        status: {"model": ErrorResponse}
        | ({"headers": RETRY_AFTER_HEADER} if status in RETRYABLE_STATUSES else {})
        for status in status_codes
    }
