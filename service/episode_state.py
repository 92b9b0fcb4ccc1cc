"""An episode's state (`EpisodeRecord`) and its transitions, as pure functions.

No I/O, no onnxruntime, no store: `EpisodeService` reads and writes the records and
`service.inference` runs the forward passes; everything here takes what it needs as arguments
(the clock too), so each transition can be tested alone. Transitions never change their input:
they return a new record around a copied context, so a request that fails halfway leaves the
stored episode exactly as it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from runtime.budget_guard import (
    UNGUARDED,
    GuardAction,
    GuardDecision,
    GuardTally,
)
from runtime.card import ModelCard
from runtime.context import EpisodeContext
from runtime.cost_critic import CostCritic, act_as_decided
from runtime.scores import over_limit
from service.errors import (
    InvalidInputError,
    PolicyOutputError,
    StepConflictError,
    StepOutOfOrderError,
)
from service.schemas import (
    BudgetUpdate,
    EpisodeCreate,
    EpisodePublic,
    EpisodeSummary,
    StepRequest,
    StepResponse,
)

Window = Mapping[str, npt.NDArray[Any]]
"""One episode's six ONNX inputs without a batch axis (`EpisodeContext.window`)."""
Outputs = tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]
"""The model's `action_mean` and `action_log_std`: [action_dim] each for one window."""
ActionBounds = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]
Reply = TypeVar("Reply", bound=StepResponse)


@dataclass(frozen=True)
class EpisodeRecord:
    """Everything the service keeps about one episode (in Redis as `service.stores.codec`'s
    bytes)."""

    episode_id: str
    model: str
    model_version: str
    deterministic: bool
    seed: int
    context: EpisodeContext
    created_at: float
    """Unix time the episode started."""
    updated_at: float
    """Unix time of the last write."""
    revision: int = 0
    """Incremented on every write."""
    owner: str = ""
    """The principal that started the episode (a token digest; "" when auth is off)."""
    budget_guard: bool = True
    """Whether the budget guard chooses this episode's actions with the model
    (`runtime.budget_guard`; the request's `budget_guard: false` turns it off)."""
    cut_floor: float | None = None
    """The lowest budget the episode's creation said it may be cut to (None: the card's)."""
    guard_action: GuardAction = GuardAction.NONE
    """What the guard did to the newest action."""
    guard_tally: GuardTally = field(default_factory=GuardTally)
    """The episode's guarded steps by action."""
    last_step: tuple[float, float] | None = None
    """The reward and cost the newest observation came with, for retries to match (None: the
    episode's start, or a record stored before they were kept)."""


def check_observation(observation: Sequence[float], card: ModelCard) -> None:
    """Raise `InvalidInputError` unless `observation` has the model's observation size."""
    expected = card.observation_dim
    if len(observation) != expected:
        detail = f"observation has {len(observation)} values, model {card.name} needs {expected}"
        raise InvalidInputError(detail, "observation")


def open_episode(
    request: EpisodeCreate,
    card: ModelCard,
    *,
    episode_id: str,
    seed: int,
    owner: str,
    now: float,
) -> EpisodeRecord:
    """The record of a new episode on `card`'s model; its step 0 still needs an action."""
    check_observation(request.observation, card)
    context = EpisodeContext.start(
        request.observation,
        request.target_reward,
        request.target_cost,
        context_len=card.context_len,
        action_dim=card.action_dim,
        seed=seed,
    )
    return EpisodeRecord(
        episode_id=episode_id,
        model=card.name,
        model_version=card.version,
        deterministic=request.deterministic,
        seed=seed,
        context=context,
        created_at=now,
        updated_at=now,
        owner=owner,
        budget_guard=request.budget_guard is not False,
        cut_floor=request.cut_floor,
    )


def is_retry(record: EpisodeRecord, request: StepRequest) -> bool:
    """True when `request` repeats the last step (answered with its recorded action).

    Raises `StepOutOfOrderError` when its step index is neither that nor the next one, and
    `StepConflictError` when it repeats the last step with another observation, reward or cost
    (a retry that would be answered as if its numbers had counted).
    """
    current = record.context.step
    if request.step is None or request.step == current + 1:
        return False
    if request.step == current:
        newest = record.context.states[-1]  # float32, as the observation was stored
        if not np.array_equal(np.asarray(request.observation, np.float32), newest):
            detail = f"step {current} was taken with another observation; next is {current + 1}"
            raise StepConflictError(detail, "observation")
        taken = dict(zip(("reward", "cost"), record.last_step or (), strict=False))
        for name, value in taken.items():
            if getattr(request, name) != value:
                detail = f"step {current} was taken with {name} {value:g}; next is {current + 1}"
                raise StepConflictError(detail, name)
        return True
    detail = f"expected step {current + 1} (or {current} to retry), got {request.step}"
    raise StepOutOfOrderError(detail, "step")


def advance(context: EpisodeContext, request: StepRequest, card: ModelCard) -> EpisodeContext:
    """A copy of `context` after the env's reward, cost and observation; it needs an action."""
    check_observation(request.observation, card)
    advanced = context.copy()
    advanced.advance(request.reward, request.cost, request.observation)
    return advanced


def guard_decision(record: EpisodeRecord, card: ModelCard) -> GuardDecision:
    """How the newest action of `record` is chosen: the card's budget guard decides from the
    budget left and the steps left (unguarded when the episode turned the guard off)."""
    if not record.budget_guard:
        return UNGUARDED
    return card.guard.decide_newest(
        record.context, card.max_episode_len, record.deterministic, record.cut_floor
    )


def act(
    context: EpisodeContext,
    outputs: Outputs,
    bounds: ActionBounds,
    deterministic: bool,
    *,
    decision: GuardDecision = UNGUARDED,
    critic: CostCritic | None = None,
) -> GuardAction:
    """Record the action the model's outputs give for the newest step of `context`, as the
    budget guard decided (its noise factor, and the cost critic's shield where it asks for it);
    what the guard did.

    Consumes the context's generator unless `deterministic`; raises `PolicyOutputError` on a
    non-finite output (the caller's copy is then dropped).
    """
    mean, log_std = outputs
    if not (np.isfinite(mean).all() and np.isfinite(log_std).all()):
        raise PolicyOutputError("the model produced a non-finite action for these inputs")
    return act_as_decided(context, outputs, bounds, deterministic, decision, critic)


def guarded(record: EpisodeRecord, action: GuardAction) -> EpisodeRecord:
    """`record` noting what the guard did to its newest action."""
    return replace(record, guard_action=action, guard_tally=record.guard_tally.add(action))


def next_revision(record: EpisodeRecord, context: EpisodeContext, *, now: float) -> EpisodeRecord:
    """`record` holding `context`, written at `now`."""
    return replace(record, context=context, updated_at=now, revision=record.revision + 1)


def rebudget(record: EpisodeRecord, request: BudgetUpdate, *, now: float) -> EpisodeRecord:
    """`record` with the budgets `request` sets; the cost-to-go window is rewritten with them."""
    context = record.context.copy()
    context.set_budget(
        cost_limit=request.cost_limit,
        remaining_cost=request.remaining_cost,
        target_reward=request.target_reward,
        remaining_reward=request.remaining_reward,
    )
    return next_revision(record, context, now=now)


def cut_without_notice(before: EpisodeRecord, after: EpisodeRecord) -> bool:
    """Whether a budget change cuts a started episode's cost limit below any floor it named at
    its creation (`cut_floor`): a cut the guard did not keep it ready for."""
    limit = after.context.target_cost
    if before.context.step == 0 or limit >= before.context.target_cost:
        return False
    return before.cut_floor is None or limit < before.cut_floor


def step_response(record: EpisodeRecord, card: ModelCard, reply: type[Reply]) -> Reply:
    """The answer to a start or step: the newest action and the budgets it was chosen under, as
    `reply` (`StepResponse`, or the websocket's `StreamAction`: built once, not copied)."""
    context = record.context
    return reply(
        episode_id=record.episode_id,
        action=context.last_action.tolist(),
        step=context.step,
        remaining_reward=context.remaining_reward,
        remaining_cost=context.remaining_cost,
        budget_exhausted=context.budget_exhausted,
        over_budget=over_budget(context),
        model=record.model,
        model_version=record.model_version,
        warnings=episode_warnings(record, card),
        budget_guard=record.budget_guard,
        guarded=record.guard_action is not GuardAction.NONE,
        guard_action=record.guard_action.value,
        revision=record.revision,
    )


def episode_public(
    record: EpisodeRecord, card: ModelCard | None, *, expires_at: float
) -> EpisodePublic:
    """State and totals of a live episode; no budget warnings once its model is gone (None)."""
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
        over_budget=over_budget(context),
        deterministic=record.deterministic,
        seed=record.seed,
        created_at=record.created_at,
        expires_at=expires_at,
        warnings=episode_warnings(record, card),
        budget_guard=record.budget_guard,
        cut_floor=record.cut_floor,
        guarded_steps=record.guard_tally.guarded_steps,
        revision=record.revision,
    )


def episode_summary(record: EpisodeRecord) -> EpisodeSummary:
    """Summary of an ended episode (its last record)."""
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
        target_cost=context.target_cost,
        over_budget=over_budget(context),
        budget_guard=record.budget_guard,
        guarded_steps=record.guard_tally.guarded_steps,
        guarded_steps_by_action=record.guard_tally.counts(),
    )


def episode_warnings(record: EpisodeRecord, card: ModelCard | None) -> list[str]:
    """A live episode's warnings: over its cost limit already (after a cut below the cost spent,
    no guard can bring it back), and a limit outside the card's validated range (none once its
    model is gone)."""
    context = record.context
    warnings = []
    if over_budget(context):
        warnings.append(
            f"cost spent {context.total_cost:g} exceeds the cost limit {context.target_cost:g}:"
            " the episode is over budget"
        )
    if card is not None:
        warnings += card.budget_warnings(context.target_cost, record.budget_guard)
    return warnings


def over_budget(context: EpisodeContext) -> bool:
    """Whether the episode's cost exceeded the cost limit in force now."""
    return bool(over_limit(context.total_cost, context.target_cost))
