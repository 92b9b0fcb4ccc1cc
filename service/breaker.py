"""A circuit breaker: after a run of failures, fail fast for a cool-down instead of waiting.

A hung dependency otherwise holds every request (and its worker thread) for a full timeout.
After the cool-down calls go through again; the first failure trips it anew, a success resets it.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class CircuitBreaker:
    """Counts consecutive failures; open (failing fast) for `cooldown_s` after `failures`."""

    def __init__(
        self, failures: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.failures = failures
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failed = 0
        self._open_until = -math.inf

    def open_for(self) -> float:
        """Seconds the breaker stays open; 0 when calls may go through."""
        return max(0.0, self._open_until - self._clock())

    def succeeded(self) -> None:
        """A call went through: close the breaker."""
        with self._lock:
            self._failed = 0

    def failed(self) -> None:
        """A call failed: open the breaker once `failures` failed in a row."""
        with self._lock:
            self._failed += 1
            if self._failed >= self.failures:
                self._open_until = self._clock() + self.cooldown_s
