"""Where episode calls run and how their forward passes reach onnxruntime: one path per app.

Calls queue on the event loop, and those of one loop turn run as one batch in a batch thread
(`TurnBatcher`): the store reads (on Redis one pipelined round trip for the whole batch), one
onnxruntime call per model, then the store writes (one more round trip). A lone call on the
in-memory store runs on the loop itself, without the thread hand-off.

`EpisodeService` states each change as a pure `Plan` (`service.episode_state`), and `Inference`
keeps two promises: a mutation holds its episode from read to write, the forward pass included
(the loop's `LoopLocks` in this process, plus the batch's claims: Redis locks across workers and
replicas), and a call that fails leaves the episode unchanged (plans work on copies). A model
that fails, or answers a non-finite action, fails only the calls whose actions it was to give.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

from runtime.budget_guard import GuardDecision
from runtime.context import batch_windows
from runtime.policy import Policy
from service.batching import TurnBatcher
from service.config import Settings
from service.episode_state import (
    EpisodeRecord,
    Outputs,
    Window,
    act,
    guard_decision,
    guarded,
)
from service.errors import ModelError, PolicyOutputError
from service.locks import LockWait, LoopLocks, poll_pauses, waiting_within
from service.metrics import Metrics
from service.preconditions import Precondition
from service.stores.base import Claim, Claimed, SessionStore
from service.stores.memory import InMemorySessionStore

logger = logging.getLogger(__name__)
Result = TypeVar("Result")


@dataclass(frozen=True)
class PendingAction:
    """A call's new record, not stored yet, waiting for the action of its newest step."""

    policy: Policy
    record: EpisodeRecord
    """Its context is the call's own copy, so a failed forward pass changes nothing stored."""

    @functools.cached_property
    def decision(self) -> GuardDecision:
        """The budget guard's decision for this action (`runtime.budget_guard`)."""
        return guard_decision(self.record, self.policy.card)

    def window(self) -> Window:
        """The forward pass's inputs: the context's window, calibrated for its action mode, as
        the budget guard feeds it."""
        context = self.record.context
        scale = self.policy.card.cost_input_scale(self.record.deterministic, context.target_cost)
        return context.window(scale, cost_left=self.decision.cost_left_fed)

    def finish(self, outputs: Outputs) -> EpisodeRecord:
        """The record with the action the forward pass's outputs give, as the guard decided;
        raises `PolicyOutputError` for non-finite outputs."""
        record, decision = self.record, self.decision
        policy = self.policy
        acted = act(
            record.context, outputs, policy.action_bounds, record.deterministic,
            decision=decision, critic=policy.cost_critic,
        )  # fmt: skip
        return guarded(record, acted)


Plan = Callable[[EpisodeRecord], EpisodeRecord | PendingAction]
"""A change of one episode: its new record (the argument itself: nothing to write), or the new
record that still needs a forward pass."""


@dataclass(frozen=True)
class Mutation:
    """A change of one stored episode, a job of the batches."""

    episode_id: str
    owner: str
    plan: Plan
    precondition: Precondition | None = None
    """What the store must find when it writes the change (`service.preconditions`)."""


@dataclass(frozen=True)
class Creation:
    """A new episode whose first action is pending, a job of the batches."""

    pending: PendingAction


Job = Mutation | Creation
Answer = EpisodeRecord | None
"""A job's stored record, or None: another call (another batch, worker or replica) held the
episode; try again."""


class Inference:
    """Runs episode calls in turn batches (`TurnBatcher`); one per app.

    The loop's `LoopLocks` keep one call per episode in this process, and the batch's claims
    hold each episode from read to write (Redis locks across replicas); a call whose episode is
    held elsewhere is tried again in a later batch. Both waits share one `LockWait`: a call
    waits `episode_lock_wait_s` in all (409), or until its own deadline when sooner (412).
    """

    inline_lone_calls = True
    """Whether a lone call (one episode stepping alone) on the in-memory store runs on the loop
    itself, without the thread hand-off."""

    def __init__(self, store: SessionStore, metrics: Metrics, settings: Settings) -> None:
        self.store = store
        self.metrics = metrics
        self._lock_wait_s = settings.episode_lock_wait_s
        self._locks = LoopLocks()  # held across the awaited batch
        self._store_blocks = not isinstance(store, InMemorySessionStore)
        self.batcher = TurnBatcher(
            self._run_batch,
            max_size=settings.batch_max_size,
            inline=self.inline_lone_calls and not self._store_blocks,
            threads=settings.batch_threads,
        )

    async def create(self, pending: PendingAction) -> EpisodeRecord:
        """Run a new episode's first forward pass and store the finished record."""
        answer = await self.batcher.submit(Creation(pending))
        assert answer is not None  # a new episode has no lock to wait for
        return answer

    async def mutate(
        self, episode_id: str, owner: str, plan: Plan, precondition: Precondition | None = None
    ) -> EpisodeRecord:
        """Apply `plan` to the episode under its lock, forward pass included, if `precondition`
        holds when it is written; the stored record. Waiting for the episode stops at the
        precondition's deadline when that comes before the lock wait's end (412)."""
        wait = LockWait.start(episode_id, self._lock_wait_s, precondition)
        async with self._locks.hold(episode_id, wait):  # the Redis lock: the rest of `wait`
            mutation = Mutation(episode_id, owner, plan, precondition)
            pauses: Iterator[float] | None = None  # made only when another replica holds it
            while (answer := await self.batcher.submit(mutation)) is None:
                pauses = pauses or poll_pauses(wait)
                await asyncio.sleep(next(pauses))
            return answer

    async def run(self, episode_id: str, call: Callable[[], Result]) -> Result:
        """Run a store call without forward pass (state, end) after the episode's call in flight;
        a wait of the call's own for the episode (Redis `delete`) ends with this one."""
        wait = LockWait.start(episode_id, self._lock_wait_s)
        async with self._locks.hold(episode_id, wait):
            bounded = functools.partial(waiting_within, wait, call)
            if self._store_blocks:
                return await run_in_threadpool(bounded)
            return bounded()

    def close(self) -> None:
        """Stop the batch threads after the batches in flight."""
        self.batcher.close()

    def forward(self, policy: Policy, pending: list[PendingAction]) -> Outputs:
        """One forward pass over the windows of `pending`, [B, action_dim] each (batch thread,
        or the loop for a lone call), each with its guard's guidance weight."""
        windows = batch_windows([p.window() for p in pending])
        outputs = policy.predict(windows, [p.decision.guidance_weight for p in pending])
        self.metrics.batch_size.observe(len(pending))
        return outputs

    def _run_batch(self, jobs: list[Job]) -> list[Answer | Exception]:
        """Claim the mutated episodes, plan, run the forward passes, store; one answer per job."""
        answers: dict[int, Answer | Exception] = {}
        held, planned = self._claim_and_plan(jobs, answers)
        finished: dict[int, EpisodeRecord] = {}
        try:
            planned |= {i: job.pending for i, job in enumerate(jobs) if isinstance(job, Creation)}
            finished = self._forward_all(planned, answers)
            for i, record in finished.items():
                if isinstance(jobs[i], Creation):
                    answers[i] = self._created(record)
        except BaseException:  # nothing is written, and every claim is released
            self._commit([(claim, claim.record) for claim in held.values()])
            raise
        writes = [(claim, finished.get(i, claim.record)) for i, claim in held.items()]
        failures = self._commit(writes)  # a refused plan or forward pass only unlocks
        for i, (_, updated), failure in zip(held, writes, failures, strict=True):
            answers.setdefault(i, updated if failure is None else failure)
        return [answers[i] for i in range(len(jobs))]

    def _commit(self, writes: list[tuple[Claim, EpisodeRecord]]) -> list[Exception | None]:
        """`store.commit_many`; a store failure fails these writes, not the batch's creations."""
        if not writes:
            return []
        try:
            return list(self.store.commit_many(writes))
        except Exception as failed:  # Redis down: the claims expire after redis_lock_ttl_s
            return [failed] * len(writes)

    def _claim_and_plan(
        self, jobs: list[Job], answers: dict[int, Answer | Exception]
    ) -> tuple[dict[int, Claim], dict[int, EpisodeRecord | PendingAction]]:
        """Claim every mutated episode in one store call and plan its change; the claims held
        and the plans, by job index (failures go to `answers`)."""
        mutations = [(i, job) for i, job in enumerate(jobs) if isinstance(job, Mutation)]
        claims: list[Claimed | Exception] = []
        if mutations:
            episodes = [(job.episode_id, job.owner) for _, job in mutations]
            try:
                claims += self.store.claim_many(episodes)
            except Exception as failed:  # Redis down: these jobs fail, the creations go on
                claims = [failed] * len(mutations)
        held: dict[int, Claim] = {}
        planned: dict[int, EpisodeRecord | PendingAction] = {}
        for (i, mutation), claim in zip(mutations, claims, strict=True):
            if not isinstance(claim, Claim):
                answers[i] = claim  # 404, 410, or None: held elsewhere
                continue
            if mutation.precondition is not None:  # checked by the store as it writes
                claim = replace(claim, precondition=mutation.precondition)
            held[i] = claim
            try:
                planned[i] = mutation.plan(claim.record)
            except Exception as refused:  # a refused step (409, 422): the episode stays as it was
                answers[i] = refused
        return held, planned

    def _created(self, record: EpisodeRecord) -> EpisodeRecord | Exception:
        """Store a new episode: the record, or why not (the cap or the owner's quota: 429)."""
        try:
            self.store.create(record)
        except Exception as refused:
            return refused
        return record

    def _forward_all(
        self,
        planned: dict[int, EpisodeRecord | PendingAction],
        answers: dict[int, Answer | Exception],
    ) -> dict[int, EpisodeRecord]:
        """The planned records, those waiting for an action finished by one forward pass per
        model; a model that fails fails its jobs only, and a non-finite action fails its own job
        only (in `answers`)."""
        finished = {i: p for i, p in planned.items() if isinstance(p, EpisodeRecord)}
        by_policy: dict[int, list[tuple[int, PendingAction]]] = {}
        for i, pending in planned.items():
            if isinstance(pending, PendingAction):
                by_policy.setdefault(id(pending.policy), []).append((i, pending))
        for group in by_policy.values():
            policy = group[0][1].policy
            try:
                mean, log_std = self.forward(policy, [p for _, p in group])
            except Exception as error:  # onnxruntime raises its own types
                failed = self._model_error(policy, error)
                answers |= {i: failed for i, _ in group}
                continue
            for row, (i, pending) in enumerate(group):
                try:
                    finished[i] = pending.finish((mean[row], log_std[row]))
                except PolicyOutputError as refused:  # 422 for this episode's call alone
                    self.metrics.model_errors.labels(policy.card.name, refused.code).inc()
                    answers[i] = refused
        return finished

    def _model_error(self, policy: Policy, error: Exception) -> ModelError:
        card = policy.card
        logger.error("forward pass of %s %s failed", card.name, card.version, exc_info=error)
        failed = ModelError(f"the model failed on this input: {error}")
        self.metrics.model_errors.labels(card.name, failed.code).inc()
        return failed
