"""Micro-batching: coalesce concurrent episodes' forward passes into one onnxruntime call.

One batcher per inference strategy that batches (`Settings.inference`, `service.inference`):

- `TurnBatcher` (`loop-batch`, the default): the calls that requests woken in the same
  event-loop turn make run as one batch in a batch thread (store reads and writes, one
  forward pass per model), while the loop goes on serving; nothing waits for company.
- `MicroBatcher` (`thread-batch`): a batcher thread collects the windows
  of calls running in worker threads: those already queued and, while other episodes are
  stepping (its last batch had company), those arriving within `batch_max_wait_ms`. Waiting
  always cost a lone episode up to +120% p50 latency on the 2-core CPU; waiting only under load
  leaves it the thread hand-off (~16%).

The graph is compute-bound on CPU (a CDT-sized window costs ~0.46 ms alone or in a batch of 32
on a 2-core AMD EPYC), so batching pays by amortising per-call and per-round-trip overhead.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

import numpy.typing as npt

from runtime.context import batch_windows
from service.episode_state import Outputs, Window

Job = TypeVar("Job")
Outcome = TypeVar("Outcome")
BatchPredict = Callable[[dict[str, npt.NDArray[Any]]], Outputs]
"""`Policy.predict`: six batched inputs in, [B, action_dim] mean and log std out."""


@dataclass
class _Pending:
    """One episode's window waiting for its slice of a batched forward pass."""

    window: Window
    done: threading.Event = field(default_factory=threading.Event)
    outputs: Outputs | None = None
    error: BaseException | None = None


class MicroBatcher:
    """One worker thread per policy that runs queued windows as a batch."""

    def __init__(
        self,
        predict: BatchPredict,
        *,
        max_size: int,
        max_wait_s: float,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self._predict = predict
        self._max_size = max_size
        self._max_wait_s = max_wait_s
        self._on_batch = on_batch
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._busy = False
        """Whether the last batch had company: only then does a batch wait for more (worker
        thread only), so a lone episode never pays `max_wait_s`."""
        self._thread = threading.Thread(target=self._run, name="cdt-micro-batcher", daemon=True)
        self._thread.start()

    def predict_one(self, window: Window) -> Outputs:
        """Forward pass for one window (no batch axis); returns `[action_dim]` mean and log std."""
        pending = _Pending(window)
        self._queue.put(pending)
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.outputs is not None
        return pending.outputs

    def close(self) -> None:
        """Stop the worker after the queued windows are served."""
        self._queue.put(None)
        self._thread.join(timeout=5.0)

    def _collect(self, first: _Pending) -> tuple[list[_Pending], bool]:
        """Gather up to `max_size` windows: those already queued, and while other episodes are
        stepping (the last batch had company) those arriving within `max_wait_s` of the first."""
        batch = [first]
        deadline = time.monotonic() + (self._max_wait_s if self._busy else 0.0)
        while len(batch) < self._max_size:
            try:
                item = self._queue.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                break
            if item is None:
                return batch, True
            batch.append(item)
        return batch, False

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = self._collect(first)
            self._busy = len(batch) > 1
            self._serve(batch)

    def _serve(self, batch: list[_Pending]) -> None:
        """Run one batched forward pass and hand every episode its row."""
        try:
            # [B, K, ...] per input, one row per waiting episode
            windows = batch_windows([pending.window for pending in batch])
            mean, log_std = self._predict(windows)  # [B, action_dim] each
            for row, pending in enumerate(batch):
                pending.outputs = (mean[row], log_std[row])
        except Exception as error:  # handed to every waiting request, which re-raises it
            for pending in batch:
                pending.error = error
        finally:
            for pending in batch:
                pending.done.set()
        if self._on_batch is not None:
            self._on_batch(len(batch))


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
