"""The budget-guard bench's rows and its check of /metrics against the client's counts."""

from __future__ import annotations

import pytest

from bench.budget_guard import (
    RowSpec,
    client_counts,
    figures,
    metrics_disagreements,
    parse_cut,
    row_specs,
)
from clients.rollout import EpisodeOutcome


def outcome(cost: float, limit: float, reward: float | None, guarded: int) -> EpisodeOutcome:
    return EpisodeOutcome(
        seed=0, steps=100, reward=0.0, cost=cost, initial_limit=limit, cost_limit=limit,
        normalised_reward=reward, normalised_cost=cost / limit, guarded_steps=guarded,
    )  # fmt: skip


def test_rows_cover_every_budget_in_both_modes_then_the_cut_at_half_the_episode() -> None:
    specs = row_specs([10.0, 20.0], (40.0, 10.0), episode_len=200)
    assert specs[:4] == [
        RowSpec(10.0, False), RowSpec(10.0, True), RowSpec(20.0, False), RowSpec(20.0, True),
    ]  # fmt: skip
    assert specs[4] == RowSpec(40.0, False, ((0, 40.0), (100, 10.0)))
    assert specs[6:] == [  # the same cut, announced: the episodes name 10 as their floor
        RowSpec(40.0, False, ((0, 40.0), (100, 10.0)), 10.0),
        RowSpec(40.0, True, ((0, 40.0), (100, 10.0)), 10.0),
    ]
    assert specs[4].schedule_text == "0:40,100:10" and specs[0].schedule_text == ""
    assert len(row_specs([10.0], None, 200)) == 2
    assert parse_cut("40:10") == (40.0, 10.0) and parse_cut("none") is None


def test_figures_share_over_mean_cost_reward_and_guarded_steps() -> None:
    row = figures([outcome(12.0, 10.0, 60.0, 4), outcome(6.0, 10.0, 70.0, 0)])
    assert row.share_over_budget == 0.5 and row.cost_mean == 9.0
    assert row.normalised_reward == pytest.approx(65.0) and row.guarded_steps_mean == 2.0
    assert figures([outcome(1.0, 10.0, None, 0)]).normalised_reward is None


def test_metrics_check_names_each_counter_that_moved_otherwise() -> None:
    counted = client_counts("m", [outcome(12.0, 10.0, None, 4), outcome(6.0, 10.0, None, 1)])
    assert counted == {
        "cdt_episodes_ended_total{model=m}": 2.0,
        "cdt_episodes_over_budget_total{model=m}": 1.0,
        "cdt_budget_guard_steps_total{model=m}": 5.0,
    }
    before = {"cdt_episodes_ended_total{model=m}": 3.0}
    after = {key: value + before.get(key, 0.0) for key, value in counted.items()}
    assert metrics_disagreements(before, after, counted) == []
    after["cdt_budget_guard_steps_total{model=m}"] = 4.0
    (wrong,) = metrics_disagreements(before, after, counted)
    assert "moved by 4" in wrong and "counted 5" in wrong
