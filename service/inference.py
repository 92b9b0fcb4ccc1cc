"""Where episode calls run and how their forward passes reach onnxruntime: one strategy per app.

`make_inference` picks one from `Settings.inference` at start-up:

- `LoopInference` (`loop-batch`): calls run on the event loop and the forward passes of one loop
  turn share an onnxruntime call (`LoopBatcher`). Only for the in-memory store, which never waits.
- `ThreadInference` (`thread`): calls run in a worker thread, one onnxruntime call each.
- `ThreadBatchInference` (`thread-batch`): calls run in a worker thread and their forward passes
  are micro-batched by a batcher thread (`MicroBatcher`).

`EpisodeService` states each change as a pure `Plan` (`service.episode_state`); a strategy runs it
keeping two promises: a mutation holds its episode's lock from read to write, the forward pass
included (the loop's `LoopLocks` or the store's own lock, a thread or Redis lock held by the
worker thread), and a call that fails leaves the episode unchanged (plans work on copies).
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from starlette.concurrency import run_in_threadpool

from service.batching import LoopBatcher, MicroBatcher
from service.config import LOOP_NEEDS_MEMORY, Settings
from service.episode_state import EpisodeRecord, Outputs, act
from service.errors import ModelError
from service.locks import LoopLocks
from service.metrics import Metrics
from service.policy import ModelRepository, Policy
from service.sessions import InMemorySessionStore, SessionStore

logger = logging.getLogger(__name__)
Result = TypeVar("Result")
Batcher = TypeVar("Batcher")
PolicyKey = tuple[str, str, str]


@dataclass(frozen=True)
class PendingAction:
    """A call's new record, not stored yet, waiting for the action of its newest step."""

    policy: Policy
    record: EpisodeRecord
    """Its context is the call's own copy, so a failed forward pass changes nothing stored."""

    def finish(self, outputs: Outputs) -> EpisodeRecord:
        """The record with the action the forward pass's outputs give."""
        act(self.record.context, outputs, self.policy.action_bounds, self.record.deterministic)
        return self.record


Plan = Callable[[EpisodeRecord], EpisodeRecord | PendingAction]
"""A change of one episode: its new record (the argument itself: nothing to write), or the new
record that still needs a forward pass."""


class Inference(ABC):
    """Runs episode calls and their forward passes; one per app, chosen at start-up."""

    def __init__(self, store: SessionStore, metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics

    @abstractmethod
    async def create(self, pending: PendingAction) -> EpisodeRecord:
        """Run a new episode's first forward pass and store the finished record."""

    @abstractmethod
    async def mutate(self, episode_id: str, owner: str, plan: Plan) -> EpisodeRecord:
        """Apply `plan` to the episode under its lock, forward pass included; the stored record."""

    @abstractmethod
    async def run(self, episode_id: str, call: Callable[[], Result]) -> Result:
        """Run a store call without forward pass (state, end) after the episode's call in flight."""

    @abstractmethod
    def close(self) -> None:
        """Stop the batchers (at shutdown)."""

    def _model_error(self, policy: Policy, error: Exception) -> ModelError:
        card = policy.card
        logger.error("forward pass of %s %s failed", card.name, card.version, exc_info=error)
        return ModelError(f"the model failed on this input: {error}")


class LoopInference(Inference):
    """`loop-batch`: calls run on the event loop, their forward passes batched per loop turn.

    The store must never wait (the in-memory store): the loop runs everything else meanwhile.
    """

    def __init__(
        self, store: SessionStore, metrics: Metrics, settings: Settings, repository: ModelRepository
    ) -> None:
        super().__init__(store, metrics)
        self._lock_wait_s = settings.episode_lock_wait_s
        self._locks = LoopLocks()  # held across the awaited forward pass
        make = partial(
            LoopBatcher, max_size=settings.batch_max_size, on_batch=metrics.batch_size.observe
        )
        self.batchers = BatcherPool(lambda policy: make(policy.predict), repository)

    async def create(self, pending: PendingAction) -> EpisodeRecord:
        """Run a new episode's first forward pass and store the finished record."""
        record = pending.finish(await self.forward(pending))
        self.store.create(record)
        return record

    async def mutate(self, episode_id: str, owner: str, plan: Plan) -> EpisodeRecord:
        """Apply `plan` to the episode under its lock, forward pass included; the stored record."""
        async with self._locks.hold(episode_id, self._lock_wait_s):
            record = self.store.get(episode_id, owner)
            planned = plan(record)
            updated = (
                planned.finish(await self.forward(planned))
                if isinstance(planned, PendingAction)
                else planned
            )
            if updated is record:
                return record
            # the loop lock kept every other writer of this episode out since the read
            return self.store.mutate(episode_id, owner, lambda _: updated)

    async def run(self, episode_id: str, call: Callable[[], Result]) -> Result:
        """Run a store call without forward pass (state, end) after the episode's call in flight."""
        async with self._locks.hold(episode_id, self._lock_wait_s):
            return call()

    def close(self) -> None:
        """Drop the batchers (they hold no thread)."""
        self.batchers.close()

    async def forward(self, pending: PendingAction) -> Outputs:
        """The forward pass for `pending`, batched with the others of this loop turn."""
        try:
            return await self.batchers.get(pending.policy).predict_one(
                pending.record.context.window()
            )
        except Exception as error:  # onnxruntime raises its own types
            raise self._model_error(pending.policy, error) from error


class ThreadInference(Inference):
    """`thread`: calls run in worker threads, each forward pass its own onnxruntime call.

    A mutation is one `store.mutate`, so the store's episode lock (a thread lock, plus Redis's
    lock key) is held across the forward pass.
    """

    async def create(self, pending: PendingAction) -> EpisodeRecord:
        """Run a new episode's first forward pass and store the finished record."""
        return await run_in_threadpool(self._create, pending)

    async def mutate(self, episode_id: str, owner: str, plan: Plan) -> EpisodeRecord:
        """Apply `plan` to the episode under its lock, forward pass included; the stored record."""
        change = partial(self._apply, plan)
        return await run_in_threadpool(self.store.mutate, episode_id, owner, change)

    async def run(self, episode_id: str, call: Callable[[], Result]) -> Result:
        """Run a store call without forward pass (state, end) in a worker thread; `end` waits
        for the call in flight on the store's episode lock."""
        return await run_in_threadpool(call)

    def close(self) -> None:
        """Nothing to stop: the forward passes run in the callers' threads."""

    def forward(self, pending: PendingAction) -> Outputs:
        """The forward pass for `pending`: a batch of one."""
        window = pending.record.context.window()
        try:
            mean, log_std = pending.policy.predict(
                {name: value[None] for name, value in window.items()}
            )
        except Exception as error:  # onnxruntime raises its own types
            raise self._model_error(pending.policy, error) from error
        self.metrics.batch_size.observe(1)
        return mean[0], log_std[0]

    def _create(self, pending: PendingAction) -> EpisodeRecord:
        record = pending.finish(self.forward(pending))
        self.store.create(record)
        return record

    def _apply(self, plan: Plan, record: EpisodeRecord) -> EpisodeRecord:
        planned = plan(record)
        if isinstance(planned, PendingAction):
            return planned.finish(self.forward(planned))
        return planned


class ThreadBatchInference(ThreadInference):
    """`thread-batch`: calls run in worker threads; a batcher thread per model version runs
    their forward passes in batches (`MicroBatcher`: it waits up to `batch_max_wait_ms` for
    company only while other episodes are stepping)."""

    def __init__(
        self, store: SessionStore, metrics: Metrics, settings: Settings, repository: ModelRepository
    ) -> None:
        super().__init__(store, metrics)
        make = partial(
            MicroBatcher,
            max_size=settings.batch_max_size,
            max_wait_s=settings.batch_max_wait_ms / 1000.0,
            on_batch=metrics.batch_size.observe,
        )
        self.batchers = BatcherPool(
            lambda policy: make(policy.predict), repository, MicroBatcher.close
        )

    def forward(self, pending: PendingAction) -> Outputs:
        """The forward pass for `pending`, micro-batched with other threads' passes."""
        try:
            return self.batchers.get(pending.policy).predict_one(pending.record.context.window())
        except Exception as error:  # onnxruntime raises its own types
            raise self._model_error(pending.policy, error) from error

    def close(self) -> None:
        """Stop the batcher threads."""
        self.batchers.close()


class BatcherPool(Generic[Batcher]):
    """One batcher per loaded model file; those of versions a reload let go of are dropped."""

    def __init__(
        self,
        make: Callable[[Policy], Batcher],
        repository: ModelRepository,
        drop: Callable[[Batcher], None] | None = None,
    ) -> None:
        self._make = make
        self._repository = repository
        self._drop = drop
        self._lock = threading.Lock()  # worker threads share the pool
        self.held: dict[PolicyKey, Batcher] = {}
        """The batchers by (name, version, fingerprint): a replaced file gets a new batcher."""

    def get(self, policy: Policy) -> Batcher:
        """The batcher of `policy`, made on first use."""
        key = (policy.card.name, policy.card.version, policy.fingerprint)
        with self._lock:
            batcher = self.held.get(key)
            if batcher is None:
                for gone in [held for held in self.held if not self._repository.serves(*held)]:
                    self._close(self.held.pop(gone))
                batcher = self.held[key] = self._make(policy)
            return batcher

    def close(self) -> None:
        """Drop every batcher."""
        with self._lock:
            for batcher in self.held.values():
                self._close(batcher)
            self.held.clear()

    def _close(self, batcher: Batcher) -> None:
        if self._drop is not None:
            self._drop(batcher)


def make_inference(
    settings: Settings, store: SessionStore, repository: ModelRepository, metrics: Metrics
) -> Inference:
    """The strategy `settings.inference` names (unset: `loop-batch` in memory, else
    `thread-batch`).

    Raises `ValueError` for `loop-batch` on a store that can wait (Redis).
    """
    in_memory = isinstance(store, InMemorySessionStore)
    mode = settings.inference or ("loop-batch" if in_memory else "thread-batch")
    if mode == "loop-batch":
        if not in_memory:
            raise ValueError(LOOP_NEEDS_MEMORY)
        return LoopInference(store, metrics, settings, repository)
    if mode == "thread-batch":
        return ThreadBatchInference(store, metrics, settings, repository)
    return ThreadInference(store, metrics)
