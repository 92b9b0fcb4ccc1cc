"""The circuit breaker opens after a run of failures, until its cool-down ends or a call gets
through; the prober runs while it is needed."""

from __future__ import annotations

import threading
import time

from service.breaker import CircuitBreaker, Prober
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


def test_breaker_success_closes_it_before_the_cooldown() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1, cooldown_s=10.0, clock=clock)
    breaker.failed()
    clock.now = 1.0
    assert breaker.open_for() == 9.0
    breaker.succeeded()  # a probe got through: half-open at once, not after 9 more seconds
    assert breaker.open_for() == 0.0


def test_prober_probes_while_needed_then_stops_until_woken() -> None:
    probes: list[float] = []
    needed = threading.Event()
    prober = Prober(lambda: probes.append(time.monotonic()), needed.is_set, interval_s=0.01)
    needed.set()
    prober.wake()
    prober.wake()  # one thread, however often woken
    deadline = time.monotonic() + 5.0
    while len(probes) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(probes) >= 3
    needed.clear()
    time.sleep(0.1)  # the thread sees no need and stops
    stopped_at = len(probes)
    time.sleep(0.1)
    assert len(probes) == stopped_at
    needed.set()
    prober.wake()  # a new need starts it again
    while len(probes) == stopped_at and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(probes) > stopped_at
    prober.close()
