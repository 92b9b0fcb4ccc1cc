"""Per-episode locks: one holder per key, FIFO on the loop, a bounded wait, nothing kept idle."""

from __future__ import annotations

import asyncio

import pytest

from service.errors import EpisodeBusyError
from service.locks import LoopLocks


def test_loop_locks_serialise_one_key_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        locks, order = LoopLocks(), []

        async def hold(name: str, pause: int) -> None:
            async with locks.hold("a", 5.0):
                for _ in range(pause):  # yields to the others while holding the lock
                    await asyncio.sleep(0)
                order.append(name)

        await asyncio.gather(hold("first", 3), hold("second", 0), hold("third", 0))
        assert locks._locks == {}
        return order

    assert asyncio.run(scenario()) == ["first", "second", "third"]


def test_loop_locks_wait_is_bounded() -> None:
    async def scenario() -> None:
        locks, release = LoopLocks(), asyncio.Event()

        async def holder() -> None:
            async with locks.hold("a", 5.0):
                await release.wait()

        task = asyncio.create_task(holder())
        await asyncio.sleep(0)
        with pytest.raises(EpisodeBusyError) as busy:
            async with locks.hold("a", 0.01):
                pass
        assert busy.value.retry_after == 1 and busy.value.status_code == 409
        release.set()
        await task
        assert locks._locks == {}

    asyncio.run(scenario())
