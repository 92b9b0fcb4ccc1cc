"""The pure episode transitions: each returns a new record and leaves its input untouched."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from runtime.budget_guard import BudgetGuard
from runtime.card import ModelCard
from runtime.episodes import EpisodePolicy, EpisodeSpec, decide
from service.episode_state import (
    EpisodeRecord,
    act,
    advance,
    episode_public,
    episode_summary,
    guard_decision,
    is_retry,
    next_revision,
    open_episode,
    rebudget,
    step_response,
)
from service.errors import (
    InvalidInputError,
    PolicyOutputError,
    StepOutOfOrderError,
)
from service.schemas import BudgetUpdate, EpisodeCreate, StepRequest, StepResponse

CARD = ModelCard(
    name="toy",
    version="3",
    task="Toy",
    observation_dim=3,
    action_dim=2,
    action_low=[-1.0, -1.0],
    action_high=[1.0, 1.0],
    context_len=4,
    max_episode_len=100,
    validated_cost_range=(5.0, 40.0),
)
BOUNDS = (np.array([-1.0, -1.0]), np.array([1.0, 1.0]))
OBSERVATION = [0.1, -0.2, 0.3]


def opened(**overrides: Any) -> EpisodeRecord:
    body = {"model": "toy", "target_reward": 50.0, "target_cost": 10.0, "observation": OBSERVATION}
    request = EpisodeCreate.model_validate(body | overrides)
    return open_episode(request, CARD, episode_id="e1", seed=7, owner="alice", now=100.0)


def outputs(*mean: float) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    return np.array(mean, np.float32), np.full(len(mean), -1.0, np.float32)


def step_request(**overrides: Any) -> StepRequest:
    body = {"observation": OBSERVATION, "reward": 2.0, "cost": 3.0}
    return StepRequest.model_validate(body | overrides)


def test_open_episode_starts_at_step_0_with_the_targets_as_budgets() -> None:
    record = opened()
    assert (record.episode_id, record.model, record.model_version) == ("e1", "toy", "3")
    assert (record.seed, record.owner, record.created_at, record.revision) == (7, "alice", 100.0, 0)
    context = record.context
    assert (context.step, context.remaining_reward, context.remaining_cost) == (0, 50.0, 10.0)
    assert context.context_len == 4 and context.last_action.tolist() == [0.0, 0.0]


def test_open_episode_wrong_observation_size_names_the_field() -> None:
    with pytest.raises(InvalidInputError) as refused:
        opened(observation=[1.0])
    assert refused.value.field == "observation" and "needs 3" in refused.value.detail


@pytest.mark.parametrize(("step", "retry"), [(None, False), (1, False), (0, True)])
def test_is_retry_tells_the_next_step_from_a_repeat_of_the_last(
    step: int | None, retry: bool
) -> None:
    assert is_retry(opened(), step_request(step=step)) is retry


@pytest.mark.parametrize("step", [2, 9])
def test_is_retry_any_other_step_index_is_out_of_order(step: int) -> None:
    with pytest.raises(StepOutOfOrderError) as refused:
        is_retry(opened(), step_request(step=step))
    assert refused.value.field == "step" and refused.value.retry_after is None


def test_advance_returns_a_copy_with_the_budgets_spent() -> None:
    record = opened()
    advanced = advance(record.context, step_request(), CARD)
    assert (advanced.step, advanced.remaining_reward, advanced.remaining_cost) == (1, 48.0, 7.0)
    assert (record.context.step, record.context.remaining_cost) == (0, 10.0)


def test_advance_wrong_observation_size_leaves_the_context() -> None:
    record = opened()
    with pytest.raises(InvalidInputError):
        advance(record.context, step_request(observation=[1.0, 2.0]), CARD)
    assert record.context.step == 0


def test_act_deterministic_records_the_clipped_mean() -> None:
    context = opened().context
    act(context, outputs(0.5, 3.0), BOUNDS, deterministic=True)
    assert context.last_action.tolist() == [0.5, 1.0]


def test_act_sampled_is_seeded_by_the_episode() -> None:
    first, second = opened().context, opened().context
    for context in (first, second):
        act(context, outputs(0.0, 0.0), BOUNDS, deterministic=False)
    assert first.last_action.tolist() == second.last_action.tolist() != [0.0, 0.0]


def test_act_non_finite_output_is_refused_and_records_nothing() -> None:
    context = opened().context
    with pytest.raises(PolicyOutputError):
        act(context, outputs(float("nan"), 0.0), BOUNDS, deterministic=True)
    assert context.last_action.tolist() == [0.0, 0.0]


def test_next_revision_bumps_the_revision_and_the_write_time() -> None:
    record = opened()
    context = advance(record.context, step_request(), CARD)
    revised = next_revision(record, context, now=130.0)
    assert (revised.revision, revised.updated_at, revised.created_at) == (1, 130.0, 100.0)
    assert revised.context is context and record.revision == 0


def test_rebudget_cost_limit_subtracts_the_cost_spent() -> None:
    record = next_revision(opened(), advance(opened().context, step_request(), CARD), now=1.0)
    changed = rebudget(record, BudgetUpdate(cost_limit=20.0), now=2.0)
    assert (changed.context.target_cost, changed.context.remaining_cost) == (20.0, 17.0)
    assert changed.revision == 2 and record.context.target_cost == 10.0


def test_step_response_warns_outside_the_validated_range() -> None:
    assert step_response(opened(), CARD, StepResponse).warnings == []
    reply = step_response(opened(target_cost=100.0), CARD, StepResponse)
    assert reply.step == 0 and "validated range" in reply.warnings[0]


def test_episode_public_without_a_served_card_has_no_warnings() -> None:
    record = opened(target_cost=100.0)
    assert episode_public(record, CARD, expires_at=700.0).warnings
    public = episode_public(record, None, expires_at=700.0)
    assert public.warnings == [] and (public.expires_at, public.seed) == (700.0, 7)


def test_episode_summary_counts_steps_from_one() -> None:
    record = next_revision(opened(), advance(opened().context, step_request(), CARD), now=1.0)
    summary = episode_summary(record)
    assert (summary.steps, summary.total_reward, summary.total_cost) == (2, 2.0, 3.0)


def test_guard_decision_is_the_offline_loops_with_the_cost_spent() -> None:
    """A cut-ready guard depends on the cost spent so far: served and offline pass the same."""
    guard = BudgetGuard(
        fallback_margin=0.0, hidden_reserve=0.0, cut_floor=12.0, cut_ready_until=0.5
    )
    card = CARD.model_copy(update={"budget_guard": guard})
    record = opened(target_cost=40.0)
    for number in range(1, 4):  # 9 spent of 40: 3 left of the floor
        record = dataclasses.replace(
            record, context=advance(record.context, step_request(step=number), card)
        )
    policy = EpisodePolicy(
        lambda window: window, 4, 2, [-1.0, -1.0], [1.0, 1.0], budget_guard=guard,
        max_episode_len=100,
    )  # fmt: skip
    spec = EpisodeSpec(7, 50.0, 40.0, deterministic=False, budget_guard=True)
    served = guard_decision(record, card)
    assert served == decide(policy, spec, record.context)
    assert served.cost_left_fed == 3.0
    early = opened(target_cost=40.0)  # nothing spent: told the floor, not the 40 left
    assert guard_decision(early, card) == decide(policy, spec, early.context)
    assert guard_decision(early, card).cost_left_fed == 12.0
