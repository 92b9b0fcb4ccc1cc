"""Micro-batching: coalesce concurrent episodes' forward passes into one onnxruntime call.

Off by default (`Settings.batching`), because it did not pay on the 2-core CPU this project
targets. bench/serve_latency.py --compare-batching (CDT-sized graph: K=10, 3 layers, width 128;
machine shared with other jobs) measured, against one forward pass per request:
- 64 concurrent episodes: +11% to +26% steps/s (max wait 0 ms and 1 ms), lower p99;
- 1 episode: p50 latency +11% (0 ms: the extra thread hand-off) to +120% (1 ms wait).
The graph is compute-bound on CPU, so a batch of 16 costs only ~25% less per episode than 16
single passes, and the forward pass is under half of a served step's CPU (request handling,
JSON, validation and thread hand-offs are the rest): batching cannot close the gap to the raw
call, and it costs latency at low load. Enable it (CDT_BATCHING=true, CDT_BATCH_MAX_WAIT_MS)
for throughput-bound deployments with many concurrent episodes, bigger models or more cores.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from service.context import WINDOW_NAMES

Window = Mapping[str, npt.NDArray[Any]]
Outputs = tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]
BatchPredict = Callable[[dict[str, npt.NDArray[Any]]], Outputs]


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
        """Gather up to `max_size` windows, waiting at most `max_wait_s` after the first."""
        batch = [first]
        deadline = time.monotonic() + self._max_wait_s
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
            self._serve(batch)

    def _serve(self, batch: list[_Pending]) -> None:
        """Run one batched forward pass and hand every episode its row."""
        try:
            # [B, K, ...] per input, one row per waiting episode
            windows = {name: np.stack([p.window[name] for p in batch]) for name in WINDOW_NAMES}
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
