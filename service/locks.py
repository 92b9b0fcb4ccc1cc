"""Per-episode locks, so the calls on one episode run one at a time in arrival order.

A step holds its episode's lock across the forward pass; a budget change, a retry of the same
step or an end that arrives meanwhile waits for it instead of failing. `LoopLocks` serialise the
calls of this process on the event loop; `poll_pauses` paces the retries of an episode that
another worker or replica holds (its Redis lock). A lock lives only while someone holds or
awaits it, so idle episodes cost nothing.

A request waits for both under one `LockWait`, taken when it starts waiting: the loop's lock and
then the Redis lock share its deadline, so a busy episode answers 409 after the lock wait, not
after two of them, and a request's own deadline (`X-Request-Deadline`) ends the wait with 412.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from service.errors import DeadlinePassedError, EpisodeBusyError
from service.preconditions import Precondition, deadline_passed

Result = TypeVar("Result")
LOCK_POLL_S = (0.001, 0.02)
"""First and longest pause between tries of an episode another worker or replica holds."""


@dataclass(frozen=True)
class LockWait:
    """How long one request may wait for its episode, the loop's and the Redis lock together."""

    episode_id: str
    wait_s: float
    """The lock wait (`episode_lock_wait_s`), named by the 409."""
    until: float
    """`time.monotonic()` when the request stops waiting."""
    precondition: Precondition | None = None
    """The request's precondition when its deadline ends the wait first (412, not 409)."""

    @classmethod
    def start(
        cls, episode_id: str, wait_s: float, precondition: Precondition | None = None
    ) -> LockWait:
        """A wait of `wait_s` from now, or until the request's deadline when that comes first."""
        now = time.monotonic()
        deadline = None if precondition is None else precondition.deadline
        # this clock stands in for the store's, which still checks the deadline as it writes
        left_s = wait_s if deadline is None else deadline - time.time()
        if left_s < wait_s:
            return cls(episode_id, wait_s, now + left_s, precondition)
        return cls(episode_id, wait_s, now + wait_s)

    def left_s(self) -> float:
        """Seconds still to wait (0 once it ended)."""
        return max(0.0, self.until - time.monotonic())

    def expired(self) -> EpisodeBusyError | DeadlinePassedError:
        """The error of a request still waiting when its wait ends: 412 `deadline_passed` when
        its own deadline ended it, else the retryable 409 `episode_busy`."""
        if self.precondition is not None:
            return deadline_passed(self.precondition)
        return episode_busy(self.episode_id, self.wait_s)


_CURRENT_WAIT: ContextVar[LockWait | None] = ContextVar("current_wait", default=None)
"""The wait of the request whose store call runs (`waiting_within`)."""


def waiting_within(wait: LockWait, call: Callable[[], Result]) -> Result:
    """`call()`, whose own waits for the episode (the Redis store's `delete`) end with `wait`
    instead of starting a wait of their own."""
    token = _CURRENT_WAIT.set(wait)
    try:
        return call()
    finally:
        _CURRENT_WAIT.reset(token)


def current_wait(episode_id: str, wait_s: float) -> LockWait:
    """The wait of the request calling (`waiting_within`) on `episode_id`, else one of `wait_s`
    from now (a store called directly)."""
    wait = _CURRENT_WAIT.get()
    if wait is not None and wait.episode_id == episode_id:
        return wait
    return LockWait.start(episode_id, wait_s)


def poll_pauses(wait: LockWait) -> Iterator[float]:
    """Pauses between tries of an episode held elsewhere, doubling from 1 ms to 20 ms, the last
    one ending at `wait.until`; then raises `wait.expired()` (409 `episode_busy`, or 412)."""
    pause, longest = LOCK_POLL_S
    while (left := wait.until - time.monotonic()) > 0:
        yield min(pause, left)
        pause = min(2 * pause, longest)
    raise wait.expired()


def episode_busy(episode_id: str, wait_s: float) -> EpisodeBusyError:
    """The retryable error of a request that waited `wait_s` for its episode in vain."""
    detail = f"episode {episode_id!r} was busy with another request for {wait_s:g} s; retry"
    return EpisodeBusyError(detail, "episode_id")


class LoopLocks:
    """One `asyncio.Lock` per key (FIFO), for code that runs on the event loop."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # key -> (lock, users)

    @asynccontextmanager
    async def hold(self, key: str, wait: LockWait | float) -> AsyncIterator[None]:
        """Hold `key`'s lock; raises `wait.expired()` (`EpisodeBusyError` for a wait of seconds
        from now) when it is still held at the end of `wait`."""
        if not isinstance(wait, LockWait):
            wait = LockWait.start(key, wait)
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            if users:  # held or awaited: wait in line, until the wait ends
                try:
                    async with asyncio.timeout(wait.left_s()):
                        await lock.acquire()
                except TimeoutError:
                    raise wait.expired() from None
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
