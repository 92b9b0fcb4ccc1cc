"""Per-episode locks, so the calls on one episode run one at a time in arrival order.

A step holds its episode's lock across the forward pass; a budget change, a retry of the same
step or an end that arrives meanwhile waits for it instead of failing. `LoopLocks` serialise the
calls of this process on the event loop; `poll_pauses` paces the retries of an episode that
another worker or replica holds (its Redis lock). A lock lives only while someone holds or
awaits it, so idle episodes cost nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

from service.errors import EpisodeBusyError

LOCK_POLL_S = (0.001, 0.02)
"""First and longest pause between tries of an episode another worker or replica holds."""


def poll_pauses(episode_id: str, wait_s: float, deadline: float) -> Iterator[float]:
    """Pauses between tries of an episode held elsewhere, doubling from 1 ms to 20 ms; raises the
    retryable `EpisodeBusyError` (waited `wait_s`) once the next pause would pass `deadline`
    (`time.monotonic`)."""
    pause, longest = LOCK_POLL_S
    while time.monotonic() + pause <= deadline:
        yield pause
        pause = min(2 * pause, longest)
    raise episode_busy(episode_id, wait_s)


def episode_busy(episode_id: str, wait_s: float) -> EpisodeBusyError:
    """The retryable error of a request that waited `wait_s` for its episode in vain."""
    detail = f"episode {episode_id!r} was busy with another request for {wait_s:g} s; retry"
    return EpisodeBusyError(detail, "episode_id")


class LoopLocks:
    """One `asyncio.Lock` per key (FIFO), for code that runs on the event loop."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # key -> (lock, users)

    @asynccontextmanager
    async def hold(self, key: str, wait_s: float) -> AsyncIterator[None]:
        """Hold `key`'s lock; raises `EpisodeBusyError` after waiting `wait_s` seconds."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            if users:  # held or awaited: wait in line, at most wait_s
                try:
                    async with asyncio.timeout(wait_s):
                        await lock.acquire()
                except TimeoutError:
                    raise episode_busy(key, wait_s) from None
            else:  # a new lock: taken at once, without the timer a timeout schedules
                await lock.acquire()
            try:
                yield
            finally:
                lock.release()
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
