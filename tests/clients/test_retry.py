"""RetryPolicy: which refusals are retried, after how long, and how often."""

from __future__ import annotations

import pytest

from clients.retry import RetryPolicy, parse_retry_after

POLICY = RetryPolicy(retries=2, max_wait_s=5.0, backoff_s=0.5)


@pytest.mark.parametrize("status", [409, 429])
def test_after_refusal_waits_the_hint_for_any_call_when_nothing_was_done(status: int) -> None:
    assert POLICY.after_refusal(0, status, 1.0, repeatable=False) == 1.0
    assert POLICY.after_refusal(1, status, 3.0, repeatable=True) == 3.0


def test_after_refusal_retries_a_503_only_for_a_repeatable_call() -> None:
    assert POLICY.after_refusal(0, 503, 1.0, repeatable=True) == 1.0
    assert POLICY.after_refusal(0, 503, 1.0, repeatable=False) is None  # it may have gone through


def test_after_refusal_without_hint_retries_only_gateway_answers_of_repeatable_calls() -> None:
    assert POLICY.after_refusal(0, 409, None, repeatable=True) is None  # step_out_of_order
    assert POLICY.after_refusal(0, 422, None, repeatable=True) is None
    assert POLICY.after_refusal(1, 504, None, repeatable=True) == 1.0  # backoff 0.5 doubled
    assert POLICY.after_refusal(0, 502, None, repeatable=False) is None


def test_after_refusal_stops_at_the_bound_and_at_hints_over_the_longest_wait() -> None:
    assert POLICY.after_refusal(2, 429, 1.0, repeatable=True) is None
    assert POLICY.after_refusal(0, 429, 30.0, repeatable=True) is None
    assert RetryPolicy(retries=0).after_refusal(0, 409, 1.0, repeatable=True) is None


def test_after_failure_backs_off_only_repeatable_calls() -> None:
    assert [POLICY.after_failure(attempt, True) for attempt in range(3)] == [0.5, 1.0, None]
    assert POLICY.after_failure(0, False) is None


@pytest.mark.parametrize(
    ("header", "seconds"),
    [("1", 1.0), ("2.5", 2.5), (None, None), ("soon", None), ("-1", None), ("nan", None)],
)
def test_parse_retry_after_reads_seconds_only(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds
