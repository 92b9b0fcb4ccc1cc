"""The circuit breaker opens after a run of failures, for its cool-down only."""

from __future__ import annotations

from service.breaker import CircuitBreaker
from tests.service.clock import FakeClock


def test_breaker_opens_after_consecutive_failures_for_the_cooldown() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(3, cooldown_s=10.0, clock=clock)
    breaker.failed()
    breaker.failed()
    breaker.succeeded()  # a success ends the run
    breaker.failed()
    breaker.failed()
    assert breaker.open_for() == 0.0
    breaker.failed()
    assert breaker.open_for() == 10.0
    clock.now = 4.0
    assert breaker.open_for() == 6.0
    clock.now = 10.0
    assert breaker.open_for() == 0.0  # half-open: calls go through again


def test_breaker_after_the_cooldown_one_failure_reopens_one_success_closes() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(2, cooldown_s=5.0, clock=clock)
    breaker.failed()
    breaker.failed()
    clock.now = 5.0
    breaker.failed()
    assert breaker.open_for() == 5.0
    clock.now = 10.0
    breaker.succeeded()
    breaker.failed()
    assert breaker.open_for() == 0.0
