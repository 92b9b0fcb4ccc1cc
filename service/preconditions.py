"""What a step or budget change may require of its episode when it is written.

A client that gave up on a request (its replica frozen, the answer lost) and sent it elsewhere
must not see the first copy applied later, over newer changes. So a change may name the
revision of the episode it was decided on (REST `If-Match: "<revision>"`, the `ETag` of every
episode answer; a websocket frame's `revision`) and a deadline after which it must not apply
(REST `X-Request-Deadline`, a frame's `deadline`: unix time in seconds). The store checks both
in the same atomic step as the write (`SessionStore.commit_many`; in Redis, its Lua script): a
change that fails either gets 412 and changes nothing. Both are optional.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.errors import DeadlinePassedError, InvalidInputError, RevisionMismatchError

_ENTITY_TAG = re.compile(r'^(?:"(\d{1,19})"|(\d{1,19}))$')
"""One strong entity tag of a revision; the quotes are optional (RFC 9110 wants them)."""


@dataclass(frozen=True)
class Precondition:
    """What must still hold when a change is written; None fields are not checked."""

    revision: int | None = None
    """The episode's revision the change was decided on: it applies only to that one."""
    deadline: float | None = None
    """Unix time (s) after which the change is not applied, on the store's clock."""

    @classmethod
    def of(cls, revision: int | None, deadline: float | None) -> Precondition | None:
        """The precondition, or None when the request has neither (nothing to check)."""
        if revision is None and deadline is None:
            return None
        return cls(revision, deadline)


def etag(revision: int) -> str:
    """The `ETag` of an episode at `revision` (its `If-Match` form too)."""
    return f'"{revision}"'


def parse_if_match(value: str | None) -> int | None:
    """The revision an `If-Match` header names; None for none or `*` (any revision). Raises
    `InvalidInputError` for anything else (a list or a weak tag never names one revision)."""
    if value is None or value.strip() == "*":
        return None
    match = _ENTITY_TAG.match(value.strip())
    if match is None:
        detail = f'If-Match must be one revision as an entity tag, e.g. "7"; got {value[:40]!r}'
        raise InvalidInputError(detail, "If-Match")
    return int(match.group(1) or match.group(2))


def unmet(
    precondition: Precondition, revision: int, now: float
) -> RevisionMismatchError | DeadlinePassedError | None:
    """Why a change with `precondition` must not be written over an episode at `revision` at
    unix time `now`; None when it may."""
    if precondition.revision is not None and precondition.revision != revision:
        return revision_mismatch(precondition, revision)
    if precondition.deadline is not None and now > precondition.deadline:
        return deadline_passed(precondition)
    return None


def revision_mismatch(precondition: Precondition, stored: int) -> RevisionMismatchError:
    """412: the change was decided on another revision than `stored`, the episode's."""
    detail = (
        f"the episode is at revision {stored}, not {precondition.revision}: it changed since; "
        "nothing was changed (read it again before deciding)"
    )
    return RevisionMismatchError(detail, revision=stored)


def deadline_passed(precondition: Precondition) -> DeadlinePassedError:
    """412: the change's deadline (unix time) passed before it could be written."""
    detail = f"the request's deadline {precondition.deadline} passed before it could apply"
    return DeadlinePassedError(detail + "; nothing was changed", "deadline")
