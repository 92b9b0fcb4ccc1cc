"""Episode logic shared by the REST routes and the websocket: start, step, budget, end.

Each call states its change with the pure transitions of `service.episode_state` and hands it to
the app's `Inference` (`service.inference`), which runs it in a turn batch on the event loop or
in a batch thread. Every mutation holds its episode's lock from read to write (the forward pass
included), so mutations of one episode apply one at a time in arrival order: a budget change
racing a step waits for it, and a retried step waits for the original and gets its action. Each
works on a copy of the context, so a request that fails at any point (bad input, model error)
leaves the episode exactly as it was.
"""

from __future__ import annotations

import copy
import secrets
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial

from runtime.card import ModelCard
from runtime.policy import Policy
from service.config import Settings
from service.episode_state import (
    EpisodeRecord,
    Reply,
    advance,
    cut_without_notice,
    episode_public,
    episode_summary,
    is_retry,
    next_revision,
    open_episode,
    over_budget,
    rebudget,
    step_response,
)
from service.errors import EpisodeGoneError, VersionElsewhereError
from service.inference import Inference, PendingAction
from service.metrics import Metrics
from service.preconditions import Precondition
from service.repository import ModelRepository
from service.schemas import (
    MAX_SEED,
    BudgetUpdate,
    EpisodeCreate,
    EpisodePublic,
    EpisodeSummary,
    StepRequest,
)
from service.stores.base import SessionStore


class EpisodeService:
    """Runs episodes of the repository's policies against a session store."""

    def __init__(
        self,
        repository: ModelRepository,
        store: SessionStore,
        metrics: Metrics,
        settings: Settings,
        *,
        inference: Inference,
    ) -> None:
        self.repository = repository
        self.store = store
        self.metrics = metrics
        self.settings = settings
        self.inference = inference
        """Where calls run and how forward passes are batched (`service.inference`)."""
        self.owner = ""
        """The principal whose episodes this service sees ("" when auth is off)."""

    def for_owner(self, owner: str) -> EpisodeService:
        """This service acting for `owner`: it starts and sees only `owner`'s episodes.

        A shallow copy, so the store and the inference batches stay shared.
        """
        bound = copy.copy(self)
        bound.owner = owner
        return bound

    @contextmanager
    def timed(self, transport: str, kind: str) -> Iterator[None]:
        """Observe the step-latency histogram around a start or step call."""
        started = time.perf_counter()
        yield
        self.metrics.step_latency.labels(transport, kind).observe(time.perf_counter() - started)

    async def start(self, request: EpisodeCreate, *, reply: type[Reply]) -> Reply:
        """Open an episode on the current version of `request.model` and return action 0 as
        `reply` (`StepResponse`, or the websocket's `StreamAction`)."""
        policy = self.repository.current(request.model)
        seed = request.seed if request.seed is not None else secrets.randbelow(MAX_SEED + 1)
        record = open_episode(
            request,
            policy.card,
            episode_id=uuid.uuid4().hex,
            seed=seed,
            owner=self.owner,
            now=time.time(),
        )
        started = time.perf_counter()
        record = await self.inference.create(PendingAction(policy, record))
        self._observe_step(record, "start", started)
        return step_response(record, policy.card, reply)

    async def step(
        self,
        episode_id: str,
        request: StepRequest,
        *,
        reply: type[Reply],
        precondition: Precondition | None = None,
    ) -> Reply:
        """Subtract the env's reward and cost, append the observation, return the next action
        as `reply`. A retry of the last step changes nothing, so its `precondition` is not
        checked: it gets the recorded action."""
        overran: list[bool] = []  # of the plan whose record was written (the last one run)

        def stepped(record: EpisodeRecord) -> EpisodeRecord | PendingAction:
            planned = self._stepped(record, request)
            overran[:] = [crosses_its_limit(record, planned)]
            return planned

        started = time.perf_counter()
        record = await self.inference.mutate(episode_id, self.owner, stepped, precondition)
        self._observe_step(record, "step", started)
        if overran and overran[0]:
            self.metrics.record_overrun(record.model, record.budget_guard)
        return step_response(record, self._policy(record).card, reply)

    async def update_budget(
        self, episode_id: str, request: BudgetUpdate, precondition: Precondition | None = None
    ) -> EpisodePublic:
        """Change the budgets, if `precondition` holds; the whole cost-to-go window is
        rewritten consistently. A cut the episode gave no notice of is answered with the
        card's measured cut figures where they miss (`ModelCard.cut_warnings`)."""
        unannounced: list[bool] = []  # of the plan whose record was written (the last one run)

        def rebudgeted(record: EpisodeRecord) -> EpisodeRecord:
            changed = self._rebudgeted(record, request)
            unannounced[:] = [cut_without_notice(record, changed)]
            return changed

        changed = await self.inference.mutate(episode_id, self.owner, rebudgeted, precondition)
        public = self._public(changed)
        card = self._card(changed)
        if unannounced and unannounced[0] and card is not None:
            warnings = public.warnings + card.cut_warnings(changed.budget_guard)
            public = public.model_copy(update={"warnings": warnings})
        return public

    async def describe(self, episode_id: str) -> EpisodePublic:
        """State and totals of a live episode."""
        get = partial(self.store.get, episode_id, self.owner)
        return self._public(await self.inference.run(episode_id, get))

    async def end(self, episode_id: str) -> EpisodeSummary:
        """End an episode; later calls on it answer 410."""
        delete = partial(self.store.delete, episode_id, self.owner)
        summary = episode_summary(await self.inference.run(episode_id, delete))
        self.metrics.record_episode_end(summary)
        return summary

    def _observe_step(self, record: EpisodeRecord, kind: str, started: float) -> None:
        """The per-model step latency (`Metrics.model_step_latency`)."""
        latency = self.metrics.model_step_latency.labels(record.model, kind)
        latency.observe(time.perf_counter() - started)

    def _stepped(
        self, record: EpisodeRecord, request: StepRequest
    ) -> EpisodeRecord | PendingAction:
        """The step's new record, waiting for its action; `record` itself for a retry."""
        if is_retry(record, request):
            return record
        policy = self._policy(record)
        context = advance(record.context, request, policy.card)
        stepped = next_revision(record, context, now=time.time())
        return PendingAction(policy, replace(stepped, last_step=(request.reward, request.cost)))

    def _rebudgeted(self, record: EpisodeRecord, request: BudgetUpdate) -> EpisodeRecord:
        return rebudget(record, request, now=time.time())

    def _public(self, record: EpisodeRecord) -> EpisodePublic:
        expires_at = record.updated_at + self.store.ttl_s
        return episode_public(record, self._card(record), expires_at=expires_at)

    def _card(self, record: EpisodeRecord) -> ModelCard | None:
        """The card of the model version `record` is pinned to; None once it is not served."""
        try:
            return self._policy(record).card
        except (EpisodeGoneError, VersionElsewhereError):
            return None

    def _policy(self, record: EpisodeRecord) -> Policy:
        """The model version `record` is pinned to."""
        return self.repository.pinned(record.model, record.model_version)


def crosses_its_limit(before: EpisodeRecord, planned: EpisodeRecord | PendingAction) -> bool:
    """Whether a step's cost takes its episode's total past the cost limit in force: counted as
    it happens, so `/metrics` sees an overrun even when the episode later expires unended."""
    if not isinstance(planned, PendingAction):  # a retry: the step was counted the first time
        return False
    return not over_budget(before.context) and over_budget(planned.record.context)
