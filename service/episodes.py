"""Episode logic shared by the REST routes and the websocket: start, step, budget, end.

Every mutation holds its episode's lock from read to write (the forward pass included), so
mutations of one episode apply one at a time in arrival order: a budget change racing a step waits
for it, and a retried step waits for the original and gets its action. Each works on a copy of
the context, so a request that fails at any point (bad input, model error) leaves the episode
exactly as it was. Calls block (onnxruntime, Redis): the routes go through `EpisodeService.run`,
which hands them to a worker thread unless they cannot wait on anything.
"""

from __future__ import annotations

import copy
import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from starlette.concurrency import run_in_threadpool

from runtime.context import EpisodeContext, sample_action
from service.batching import LoopBatcher, MicroBatcher, Outputs
from service.config import Settings
from service.errors import (
    EpisodeGoneError,
    InvalidInputError,
    ModelError,
    PolicyOutputError,
    StepOutOfOrderError,
)
from service.locks import LoopLocks
from service.metrics import Metrics
from service.policy import ModelRepository, Policy
from service.schemas import (
    MAX_SEED,
    BudgetUpdate,
    EpisodeCreate,
    EpisodePublic,
    EpisodeSummary,
    StepRequest,
    StepResponse,
)
from service.sessions import EpisodeRecord, InMemorySessionStore, SessionStore

logger = logging.getLogger(__name__)
Result = TypeVar("Result")


class EpisodeService:
    """Runs episodes of the repository's policies against a session store."""

    def __init__(
        self,
        repository: ModelRepository,
        store: SessionStore,
        metrics: Metrics,
        settings: Settings,
    ) -> None:
        self.repository = repository
        self.store = store
        self.metrics = metrics
        self.settings = settings
        self._batchers: dict[tuple[str, str, str], MicroBatcher] = {}
        self._batchers_lock = threading.Lock()
        self._loop_batchers: dict[tuple[str, str, str], LoopBatcher] = {}  # event-loop thread only
        self._loop_locks = LoopLocks()  # episodes of the inline path, held across forward passes
        self.owner = ""
        """The principal whose episodes this service sees ("" when auth is off)."""

    def for_owner(self, owner: str) -> EpisodeService:
        """This service acting for `owner`: it starts and sees only `owner`'s episodes.

        A shallow copy, so the store, batchers and locks stay shared (none is ever reassigned).
        """
        bound = copy.copy(self)
        bound.owner = owner
        return bound

    @property
    def inline(self) -> bool:
        """True when calls never wait on I/O or on other requests, so the event loop runs them."""
        in_memory = isinstance(self.store, InMemorySessionStore)
        return self.settings.inline_steps and in_memory and not self.settings.batching

    async def run(self, function: Callable[..., Result], episode_id: str, *args: Any) -> Result:
        """Call a per-episode method (`update_budget`, `describe`, `end`) from async code.

        Inline, it waits for the episode's call in flight (a step awaiting its forward pass);
        in a worker thread the store's episode lock does that.
        """
        if not self.inline:
            return await run_in_threadpool(function, episode_id, *args)
        async with self._loop_locks.hold(episode_id, self.settings.episode_lock_wait_s):
            return function(episode_id, *args)

    @contextmanager
    def timed(self, transport: str, kind: str) -> Iterator[None]:
        """Observe the step-latency histogram around a start or step call."""
        started = time.perf_counter()
        yield
        self.metrics.step_latency.labels(transport, kind).observe(time.perf_counter() - started)

    def start(self, request: EpisodeCreate) -> StepResponse:
        """Open an episode on the current version of `request.model` and return action 0."""
        policy, context, seed = self._open(request)
        context.record_action(self._act(policy, context, request.deterministic))
        return self._create(policy, context, request, seed)

    async def start_async(self, request: EpisodeCreate) -> StepResponse:
        """`start` from async code: on the loop, its forward pass batched with the turn's others."""
        if not self.inline:
            return await run_in_threadpool(self.start, request)
        policy, context, seed = self._open(request)
        outputs = await self._forward_async(policy, context.window())
        context.record_action(self._sample(policy, context, request.deterministic, outputs))
        return self._create(policy, context, request, seed)

    def step(self, episode_id: str, request: StepRequest) -> StepResponse:
        """Subtract the env's reward and cost, append the observation, return the next action."""
        stepped = partial(self._stepped, request=request)
        record = self.store.mutate(episode_id, self.owner, stepped)
        return _step_response(record, self._policy(record))

    async def step_async(self, episode_id: str, request: StepRequest) -> StepResponse:
        """`step` from async code: on the loop, its forward pass batched with the turn's others."""
        if not self.inline:
            return await run_in_threadpool(self.step, episode_id, request)
        async with self._loop_locks.hold(episode_id, self.settings.episode_lock_wait_s):
            record = self.store.get(episode_id, self.owner)
            prepared = self._prepare_step(record, request)
            if prepared is not None:
                policy, context = prepared
                outputs = await self._forward_async(policy, context.window())
                context.record_action(self._sample(policy, context, record.deterministic, outputs))
                updated = _next_revision(record, context)
                # the loop lock kept every other writer of this episode out since the read
                record = self.store.mutate(episode_id, self.owner, lambda _: updated)
        return _step_response(record, self._policy(record))

    def _open(self, request: EpisodeCreate) -> tuple[Policy, EpisodeContext, int]:
        """The policy, new context and seed of a `start` request, before its first action."""
        policy = self.repository.current(request.model)
        _check_observation(request.observation, policy)
        seed = request.seed if request.seed is not None else secrets.randbelow(MAX_SEED + 1)
        context = EpisodeContext.start(
            request.observation,
            request.target_reward,
            request.target_cost,
            context_len=policy.card.context_len,
            action_dim=policy.card.action_dim,
            seed=seed,
        )
        return policy, context, seed

    def _create(
        self, policy: Policy, context: EpisodeContext, request: EpisodeCreate, seed: int
    ) -> StepResponse:
        """Store a started episode (its first action recorded) and answer with that action."""
        now = time.time()
        record = EpisodeRecord(
            episode_id=uuid.uuid4().hex,
            model=policy.card.name,
            model_version=policy.card.version,
            deterministic=request.deterministic,
            seed=seed,
            context=context,
            created_at=now,
            updated_at=now,
            owner=self.owner,
        )
        self.store.create(record)
        return _step_response(record, policy)

    def _stepped(self, record: EpisodeRecord, request: StepRequest) -> EpisodeRecord:
        """`record` after the step, its action recorded; `record` itself for a retry."""
        prepared = self._prepare_step(record, request)
        if prepared is None:
            return record
        policy, context = prepared
        context.record_action(self._act(policy, context, record.deterministic))
        return _next_revision(record, context)

    def _prepare_step(
        self, record: EpisodeRecord, request: StepRequest
    ) -> tuple[Policy, EpisodeContext] | None:
        """None for a retry of the last step, else the policy and a copy of the advanced context."""
        current = record.context.step
        if request.step is not None and request.step == current:
            return None  # a retry: answered with the recorded action
        if request.step is not None and request.step != current + 1:
            detail = f"expected step {current + 1} (or {current} to retry), got {request.step}"
            raise StepOutOfOrderError(detail, "step")
        policy = self._policy(record)
        _check_observation(request.observation, policy)
        context = record.context.copy()
        context.advance(request.reward, request.cost, request.observation)
        return policy, context

    def update_budget(self, episode_id: str, request: BudgetUpdate) -> EpisodePublic:
        """Change the budgets; the whole cost-to-go window is rewritten consistently."""
        rebudgeted = partial(_rebudgeted, request=request)
        return self._public(self.store.mutate(episode_id, self.owner, rebudgeted))

    def describe(self, episode_id: str) -> EpisodePublic:
        """State and totals of a live episode."""
        return self._public(self.store.get(episode_id, self.owner))

    def end(self, episode_id: str) -> EpisodeSummary:
        """End an episode; later calls on it answer 410."""
        record = self.store.delete(episode_id, self.owner)
        context = record.context
        return EpisodeSummary(
            episode_id=record.episode_id,
            model=record.model,
            model_version=record.model_version,
            steps=context.step + 1,
            total_reward=context.total_reward,
            total_cost=context.total_cost,
            remaining_reward=context.remaining_reward,
            remaining_cost=context.remaining_cost,
            budget_exhausted=context.budget_exhausted,
        )

    def close(self) -> None:
        """Stop the micro-batchers."""
        with self._batchers_lock:
            for batcher in self._batchers.values():
                batcher.close()
            self._batchers.clear()

    def _public(self, record: EpisodeRecord) -> EpisodePublic:
        context = record.context
        return EpisodePublic(
            episode_id=record.episode_id,
            model=record.model,
            model_version=record.model_version,
            step=context.step,
            target_reward=context.target_reward,
            target_cost=context.target_cost,
            remaining_reward=context.remaining_reward,
            remaining_cost=context.remaining_cost,
            total_reward=context.total_reward,
            total_cost=context.total_cost,
            budget_exhausted=context.budget_exhausted,
            deterministic=record.deterministic,
            seed=record.seed,
            created_at=record.created_at,
            expires_at=record.updated_at + self.store.ttl_s,
            warnings=self._warnings(record),
        )

    def _warnings(self, record: EpisodeRecord) -> list[str]:
        try:
            policy = self._policy(record)
        except EpisodeGoneError:
            return []
        return policy.card.budget_warnings(record.context.target_cost)

    def _policy(self, record: EpisodeRecord) -> Policy:
        """The model version `record` is pinned to."""
        return self.repository.pinned(record.model, record.model_version)

    def _act(self, policy: Policy, context: EpisodeContext, deterministic: bool) -> Any:
        """Forward pass and sampling for the newest step; consumes the context's generator."""
        return self._sample(policy, context, deterministic, self._forward(policy, context.window()))

    def _sample(
        self, policy: Policy, context: EpisodeContext, deterministic: bool, outputs: Outputs
    ) -> Any:
        """The action from the model's mean and log std; consumes the context's generator."""
        mean, log_std = outputs
        if not (np.isfinite(mean).all() and np.isfinite(log_std).all()):
            raise PolicyOutputError("the model produced a non-finite action for these inputs")
        low, high = policy.action_bounds
        return sample_action(mean, log_std, context.rng, low, high, deterministic)

    def _forward(self, policy: Policy, window: dict[str, npt.NDArray[Any]]) -> Outputs:
        """[action_dim] mean and log std, micro-batched when enabled."""
        try:
            if self.settings.batching:
                return self._batcher(policy).predict_one(window)
            mean, log_std = policy.predict({name: value[None] for name, value in window.items()})
        except Exception as error:  # onnxruntime raises its own types; the episode is unchanged
            raise self._model_error(policy, error) from error
        self.metrics.batch_size.observe(1)
        return mean[0], log_std[0]

    async def _forward_async(self, policy: Policy, window: dict[str, npt.NDArray[Any]]) -> Outputs:
        """`_forward` on the event loop, batched with the other windows of the same loop turn."""
        try:
            return await self._loop_batcher(policy).predict_one(window)
        except Exception as error:
            raise self._model_error(policy, error) from error

    def _model_error(self, policy: Policy, error: Exception) -> ModelError:
        card = policy.card
        logger.error("forward pass of %s %s failed", card.name, card.version, exc_info=error)
        return ModelError(f"the model failed on this input: {error}")

    def _loop_batcher(self, policy: Policy) -> LoopBatcher:
        key = _batcher_key(policy)
        batcher = self._loop_batchers.get(key)
        if batcher is None:
            for gone in [held for held in self._loop_batchers if not self._serves(held)]:
                del self._loop_batchers[gone]  # a version a reload let go of
            batcher = LoopBatcher(
                policy.predict,
                max_size=self.settings.batch_max_size,
                on_batch=self.metrics.batch_size.observe,
            )
            self._loop_batchers[key] = batcher
        return batcher

    def _batcher(self, policy: Policy) -> MicroBatcher:
        key = _batcher_key(policy)
        with self._batchers_lock:
            if key not in self._batchers:
                for gone in [held for held in self._batchers if not self._serves(held)]:
                    self._batchers.pop(gone).close()
                self._batchers[key] = MicroBatcher(
                    policy.predict,
                    max_size=self.settings.batch_max_size,
                    max_wait_s=self.settings.batch_max_wait_ms / 1000.0,
                    on_batch=self.metrics.batch_size.observe,
                )
            return self._batchers[key]

    def _serves(self, key: tuple[str, str, str]) -> bool:
        return self.repository.serves(*key)


def _batcher_key(policy: Policy) -> tuple[str, str, str]:
    """(name, version, fingerprint): a file replaced under the same version gets a new batcher."""
    return policy.card.name, policy.card.version, policy.fingerprint


def _check_observation(observation: Sequence[float], policy: Policy) -> None:
    expected = policy.card.observation_dim
    if len(observation) != expected:
        name = policy.card.name
        detail = f"observation has {len(observation)} values, model {name} needs {expected}"
        raise InvalidInputError(detail, "observation")


def _rebudgeted(record: EpisodeRecord, request: BudgetUpdate) -> EpisodeRecord:
    """`record` with the budgets `request` sets."""
    context = record.context.copy()
    context.set_budget(
        cost_limit=request.cost_limit,
        remaining_cost=request.remaining_cost,
        target_reward=request.target_reward,
        remaining_reward=request.remaining_reward,
    )
    return _next_revision(record, context)


def _next_revision(record: EpisodeRecord, context: EpisodeContext) -> EpisodeRecord:
    return replace(record, context=context, updated_at=time.time(), revision=record.revision + 1)


def _step_response(record: EpisodeRecord, policy: Policy) -> StepResponse:
    context = record.context
    return StepResponse(
        episode_id=record.episode_id,
        action=context.last_action.tolist(),
        step=context.step,
        remaining_reward=context.remaining_reward,
        remaining_cost=context.remaining_cost,
        budget_exhausted=context.budget_exhausted,
        model=record.model,
        model_version=record.model_version,
        warnings=policy.card.budget_warnings(context.target_cost),
    )
