"""Micro-batching: coalesce concurrent episodes' forward passes into one onnxruntime call.

One batcher per inference strategy that batches (`Settings.inference`, `service.inference`):

- `LoopBatcher` (`loop-batch`, the default with the in-memory store): requests woken in the same
  event-loop turn share one forward pass, and nothing waits for company. Measured with
  bench/serve_latency.py on a 2 x 64 x 4 CDT (2-core CPU, load generator on the same cores):
  64 websocket episodes went from ~1,300 to ~2,650 steps/s; one episode's p50 did not move.
- `MicroBatcher` (`thread-batch`, the default with Redis): a batcher thread collects the windows
  of calls running in worker threads: those already queued and, while other episodes are
  stepping (its last batch had company), those arriving within `batch_max_wait_ms`. Waiting
  always cost a lone episode up to +120% p50 latency on the 2-core CPU; waiting only under load
  leaves it the thread hand-off (~16%).

The graph is compute-bound on CPU (a batch of 32 costs ~40% less per window than single
passes), so batching pays mostly by amortising per-call overhead and cache warm-up.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

from runtime.context import batch_windows
from service.episode_state import Outputs, Window

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


class LoopBatcher:
    """Batches the forward passes that requests on one event loop ask for in the same turn.

    Nothing waits for company: the first window of a turn schedules one flush with
    `call_soon`, which runs after every request the loop already woke (a burst of frames
    from many sockets) has queued its window. One episode alone pays one loop turn (~µs).
    The forward pass runs on the loop thread: use it only where nothing else would block.
    """

    def __init__(
        self,
        predict: BatchPredict,
        *,
        max_size: int,
        on_batch: Callable[[int], None] | None = None,
    ) -> None:
        self._predict = predict
        self._max_size = max_size
        self._on_batch = on_batch
        self._waiting: list[tuple[Window, asyncio.Future[Outputs]]] = []

    async def predict_one(self, window: Window) -> Outputs:
        """Forward pass for one window (no batch axis); returns `[action_dim]` mean and log std."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Outputs] = loop.create_future()
        self._waiting.append((window, future))
        if len(self._waiting) == 1:
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        batch, self._waiting = self._waiting[: self._max_size], self._waiting[self._max_size :]
        if self._waiting:
            asyncio.get_running_loop().call_soon(self._flush)
        try:
            mean, log_std = self._predict(batch_windows([window for window, _ in batch]))  # [B, A]
        except Exception as error:  # every waiting request re-raises it
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for row, (_, future) in enumerate(batch):
            if not future.done():  # its request may have been cancelled (client gone)
                future.set_result((mean[row], log_std[row]))
        if self._on_batch is not None:
            self._on_batch(len(batch))
