"""Turn batching: the calls that requests woken in one event-loop turn make run as one batch.

`TurnBatcher` runs each batch (store reads and writes, one forward pass per model; see
`service.inference`) in a batch thread while the loop goes on serving; nothing waits for
company. The graph is compute-bound on CPU (a CDT-sized window costs ~0.46 ms alone or in a
batch of 32 on a 2-core AMD EPYC), so batching pays by amortising per-call and per-round-trip
overhead, and two batch threads use the second core.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Generic, TypeVar

Job = TypeVar("Job")
Outcome = TypeVar("Outcome")


class TurnBatcher(Generic[Job, Outcome]):
    """Runs the jobs that requests on one event loop submit in the same turn as one batch.

    Nothing waits for company: the first job of a turn schedules one flush with `call_soon`,
    which runs after every request the loop already woke (a burst of frames from many sockets)
    has submitted its job. Batches run in the batcher's own threads, at most `threads` at once,
    so the loop keeps reading and answering other requests meanwhile and the next batch gathers
    while others run: on 2 cores two batches' forward passes run side by side.
    With `inline`, a lone job (one episode stepping alone) runs on the loop itself and skips
    the thread hand-off; only for runs that never block (the in-memory store).

    `run` answers one outcome per job, an exception for a job that failed; if it raises, every
    job of the batch gets the error.
    """

    def __init__(
        self,
        run: Callable[[list[Job]], list[Outcome | Exception]],
        *,
        max_size: int,
        inline: bool,
        threads: int = 1,
    ) -> None:
        self._run = run
        self._max_size = max_size
        self._inline = inline
        self._threads = threads
        self._waiting: list[tuple[Job, asyncio.Future[Outcome]]] = []
        self._in_flight = 0
        self._busy = False
        """Whether the last batch had company: then even a lone job goes to the thread, so
        the loop stays free for the requests about to follow."""
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="cdt-turn-batch")

    async def submit(self, job: Job) -> Outcome:
        """Run `job` in this turn's batch (or the next, while one runs); its outcome."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outcome] = loop.create_future()
        self._waiting.append((job, future))
        if len(self._waiting) == 1:
            loop.call_soon(self._flush)
        return await future

    def close(self) -> None:
        """Let the batches in flight finish; later batches are refused."""
        self._executor.shutdown(wait=True)

    def _flush(self) -> None:
        if self._in_flight == self._threads or not self._waiting:
            return  # a batch in flight flushes again when it is done
        # a call cancelled before its batch starts (client gone) changes nothing
        self._waiting = [(job, future) for job, future in self._waiting if not future.done()]
        batch, self._waiting = self._waiting[: self._max_size], self._waiting[self._max_size :]
        if not batch:
            return
        lone = len(batch) == 1 and not self._waiting and not self._busy and not self._in_flight
        self._busy = len(batch) > 1
        jobs = [job for job, _ in batch]
        if self._inline and lone:
            self._settle(batch, self._run_all(jobs))
            return
        self._in_flight += 1
        done = asyncio.get_running_loop().run_in_executor(self._executor, self._run_all, jobs)
        done.add_done_callback(partial(self._finished, batch))
        if self._waiting:  # more than one batch's worth: the next may start in another thread
            asyncio.get_running_loop().call_soon(self._flush)

    def _finished(
        self,
        batch: list[tuple[Job, asyncio.Future[Outcome]]],
        done: asyncio.Future[list[Outcome | Exception]],
    ) -> None:
        self._in_flight -= 1
        outcomes: list[Outcome | Exception]
        if done.cancelled():  # the loop is shutting down
            for _, future in batch:
                future.cancel()
            return
        try:
            outcomes = done.result()
        except Exception as error:  # the executor refused the batch (shutting down)
            outcomes = [error] * len(batch)
        self._settle(batch, outcomes)
        self._flush()  # the batch that gathered meanwhile

    def _run_all(self, jobs: list[Job]) -> list[Outcome | Exception]:
        try:
            outcomes = self._run(jobs)
        except Exception as error:  # every job of the batch re-raises it
            return [error] * len(jobs)
        return outcomes

    @staticmethod
    def _settle(
        batch: list[tuple[Job, asyncio.Future[Outcome]]], outcomes: list[Outcome | Exception]
    ) -> None:
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():  # its request was cancelled (client gone)
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
