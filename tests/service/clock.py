"""A clock the tests move by hand (TTL and breaker timing without sleeping)."""

from __future__ import annotations


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
