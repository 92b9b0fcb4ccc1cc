"""Turn batching: one batch per event-loop turn, in batch threads, each job its own outcome."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from service.batching import TurnBatcher


def test_turn_batcher_runs_one_turn_in_batches_of_at_most_max_size() -> None:
    batches: list[list[int]] = []

    def doubled(jobs: list[int]) -> list[int | Exception]:
        batches.append(jobs)
        return [2 * job for job in jobs]

    batcher: TurnBatcher[int, int] = TurnBatcher(doubled, max_size=4, inline=True)

    async def together() -> list[int]:
        return await asyncio.gather(*(batcher.submit(job) for job in range(10)))

    assert asyncio.run(together()) == [2 * job for job in range(10)]
    batcher.close()
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_turn_batcher_gathers_the_next_batch_while_one_runs_in_its_thread() -> None:
    threads: list[str] = []
    release = threading.Event()

    def run(jobs: list[int]) -> list[int | Exception]:
        threads.append(threading.current_thread().name)
        release.wait(5)
        return list(jobs)

    batcher: TurnBatcher[int, int] = TurnBatcher(run, max_size=32, inline=True)

    async def overlapping() -> list[int]:
        first = asyncio.gather(*(batcher.submit(job) for job in (0, 1)))  # company: a thread
        await asyncio.sleep(0.05)  # the loop is free while the first batch runs
        later = asyncio.gather(*(batcher.submit(job) for job in (2, 3, 4)))
        await asyncio.sleep(0.05)
        release.set()
        return [*await first, *await later]

    assert asyncio.run(overlapping()) == [0, 1, 2, 3, 4]
    batcher.close()
    assert len(threads) == 2 and all(name.startswith("cdt-turn-batch") for name in threads)


def test_turn_batcher_runs_a_lone_job_inline_only_when_allowed() -> None:
    for inline, expected in ((True, "MainThread"), (False, "cdt-turn-batch")):
        where: list[str] = []

        def run(jobs: list[int], where: list[str] = where) -> list[int | Exception]:
            where.append(threading.current_thread().name)
            return list(jobs)

        batcher: TurnBatcher[int, int] = TurnBatcher(run, max_size=4, inline=inline)
        assert asyncio.run(batcher.submit(7)) == 7
        batcher.close()
        assert where[0].startswith(expected)


def test_turn_batcher_hands_each_job_its_outcome_and_a_crash_to_every_job() -> None:
    def per_job(jobs: list[int]) -> list[int | Exception]:
        return [RuntimeError(f"job {job} refused") if job % 2 else job for job in jobs]

    def crash(jobs: list[int]) -> list[int | Exception]:
        raise RuntimeError("batch exploded")

    async def three(batcher: TurnBatcher[int, int]) -> list[Any]:
        calls = (batcher.submit(job) for job in range(3))
        return await asyncio.gather(*calls, return_exceptions=True)

    for run, expected in (
        (per_job, ["0", "job 1 refused", "2"]),
        (crash, ["batch exploded"] * 3),
    ):
        batcher: TurnBatcher[int, int] = TurnBatcher(run, max_size=4, inline=False)
        assert [str(outcome) for outcome in asyncio.run(three(batcher))] == expected
        batcher.close()


def test_turn_batcher_skips_a_job_cancelled_before_its_batch_starts() -> None:
    ran: list[int] = []

    def run(jobs: list[int]) -> list[int | Exception]:
        ran.extend(jobs)
        return list(jobs)

    batcher: TurnBatcher[int, int] = TurnBatcher(run, max_size=4, inline=False)

    async def one_cancelled() -> list[int]:
        gone = asyncio.ensure_future(batcher.submit(1))
        kept = asyncio.ensure_future(batcher.submit(2))
        await asyncio.sleep(0)  # both queued, the flush not yet run
        gone.cancel()
        return [await kept]

    assert asyncio.run(one_cancelled()) == [2]
    batcher.close()
    assert ran == [2]
