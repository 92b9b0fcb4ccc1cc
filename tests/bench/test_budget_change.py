"""Budget schedules and their rows, as the budget-change bench sums served episodes."""

from __future__ import annotations

import pytest

from bench.budget_change import schedule_steps, summarise
from clients.rollout import EpisodeOutcome


def outcome(cost: float, final_limit: float, reward: float) -> EpisodeOutcome:
    return EpisodeOutcome(
        seed=0,
        steps=200,
        reward=reward,
        cost=cost,
        initial_limit=40.0,
        cost_limit=final_limit,
        normalised_reward=None,
        normalised_cost=cost / final_limit,
        budget_changes=[(100, final_limit)],
    )


def test_a_row_counts_episodes_over_the_budget_in_force_at_their_end() -> None:
    # 40 then 10: an episode that spent 28.7 before the change ends over the new budget
    row = summarise("0:40,100:10", True, [outcome(28.7, 10.0, 520.0), outcome(7.0, 10.0, 500.0)])
    assert (row.episodes_over, row.episodes) == (1, 2)
    assert row.cost_mean == pytest.approx(17.85) and row.reward_mean == pytest.approx(510.0)


def test_a_schedule_must_name_the_first_budget_at_step_0() -> None:
    assert schedule_steps("100:10,0:40") == ((0, 40.0), (100, 10.0))
    for bad in ("100:10", "", "0:-1"):
        with pytest.raises(ValueError):
            schedule_steps(bad)
