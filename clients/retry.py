"""When the clients send a refused or unanswered call again: the server's hints, bounded.

The service marks a refusal worth retrying with `Retry-After` (REST) or `retry_after` (websocket
`error` frames): 409 `episode_busy`, 429 (`too_many_episodes`, `episode_quota_exceeded`) and 503.
A 409 `episode_busy` or a 429 changed nothing, so any call may be sent again. A 503 may hide a
write that went through (Redis applied it, its reply was lost), so only a call that is safe to
repeat is: a numbered step, which the service answers with the action it recorded. A numbered
step is also retried after a transport error or a 502/503/504 without hint, after a backoff.
"""

from __future__ import annotations

from dataclasses import dataclass

HINTED_STATUS = frozenset({409, 429, 503})
"""Refusals that carry a retry hint when retrying can help (409 only for `episode_busy`)."""
GATEWAY_STATUS = frozenset({502, 503, 504})
"""Answers that say nothing about the call itself: a repeatable call is retried after a backoff."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a client retries one call (see the module docstring for which)."""

    retries: int = 2
    """Extra attempts of one call; 0 never retries."""
    max_wait_s: float = 5.0
    """Longest server hint waited for; a refusal that asks for more is raised at once."""
    backoff_s: float = 0.05
    """First pause before retrying a repeatable call without hint, doubling each attempt."""

    def after_failure(self, attempt: int, repeatable: bool) -> float | None:
        """Seconds to wait after attempt `attempt` (0 first) got no usable answer (a transport
        error or a 502/503/504 without hint); None when the call must fail now."""
        if attempt >= self.retries or not repeatable:
            return None
        return float(self.backoff_s * 2**attempt)

    def after_refusal(
        self, attempt: int, status_code: int, retry_after: float | None, repeatable: bool
    ) -> float | None:
        """Seconds to wait after attempt `attempt` was refused with `status_code` and the
        server's hint `retry_after` (None: no hint); None when the call must fail now."""
        if retry_after is None or status_code not in HINTED_STATUS:
            return (
                self.after_failure(attempt, repeatable) if status_code in GATEWAY_STATUS else None
            )
        if attempt >= self.retries or (status_code == 503 and not repeatable):
            return None
        if not retry_after <= self.max_wait_s:  # too long, or NaN
            return None
        return max(0.0, float(retry_after))  # a websocket hint may be negative


def parse_retry_after(value: str | None) -> float | None:
    """The seconds of a `Retry-After` header (the service sends whole seconds); None when absent
    or not a number of seconds (an HTTP date is not honoured)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < float("inf") else None
