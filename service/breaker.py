"""A circuit breaker: after a run of failures, fail fast instead of waiting, until a probe
gets through.

A hung dependency otherwise holds every request (and its worker thread) for a full timeout.
While the breaker is open, calls fail at once and a `Prober` thread tries the dependency every
`interval_s`: its first success closes the breaker (half-open), so a short stall costs about
one probe interval after the dependency is back, not the whole cool-down. Without a probe the
breaker lets calls through again after `cooldown_s`; the first failure trips it anew, and any
success closes it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)


class CircuitBreaker:
    """Counts consecutive failures; open (failing fast) for `cooldown_s` after `failures`, or
    until a call succeeds."""

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
        """Seconds the breaker stays open unless a probe closes it; 0 when calls may go
        through."""
        return max(0.0, self._open_until - self._clock())

    def succeeded(self) -> None:
        """A call (or a probe) went through: close the breaker."""
        with self._lock:
            self._failed = 0
            self._open_until = -math.inf

    def failed(self) -> None:
        """A call failed: open the breaker once `failures` failed in a row."""
        with self._lock:
            self._failed += 1
            if self._failed >= self.failures:
                self._open_until = self._clock() + self.cooldown_s


class Prober:
    """Runs `probe` every `interval_s` in a daemon thread for as long as `needed()` says so.

    `wake()` starts the thread when it is not running; it stops by itself once `needed()` is
    false, and for good at `close()`. `needed` is read under the same lock as `wake`'s check, so
    a need that arises just as the thread stops is not missed.
    """

    def __init__(
        self, probe: Callable[[], None], needed: Callable[[], bool], interval_s: float
    ) -> None:
        self._probe = probe
        self._needed = needed
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._running = False
        self._closed = threading.Event()

    def wake(self) -> None:
        """Start probing unless a probe thread runs already (or the prober is closed)."""
        with self._lock:
            if self._running or self._closed.is_set():
                return
            self._running = True
        threading.Thread(target=self._run, name="cdt-store-probe", daemon=True).start()

    def close(self) -> None:
        """Stop probing (the thread exits after the probe in progress, if any)."""
        self._closed.set()

    def _run(self) -> None:
        try:
            while not self._closed.wait(self.interval_s):
                with self._lock:
                    if not self._needed():
                        self._running = False
                        return
                self._probe()
        except Exception:  # a bug in the probe: log it, and let a later wake() start anew
            logger.exception("store probe failed")
        with self._lock:
            self._running = False
