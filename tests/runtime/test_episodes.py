"""The one episode loop (runtime/episodes.py) on a toy env and a scripted policy."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pytest

from runtime.episodes import EpisodePolicy, EpisodeSpec, run_episodes
from tests.runtime.toy_env import toy_env_factory


def recording_policy(seen: list[dict[str, np.ndarray]]) -> EpisodePolicy:
    """Acts with the newest cost-to-go (clipped) as its first action entry; records windows."""

    def predict(
        windows: dict[str, np.ndarray], _weights: Sequence[float | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        seen.append({name: value.copy() for name, value in windows.items()})
        batch = windows["costs_to_go"].shape[0]
        mean = np.zeros((batch, 2))
        mean[:, 0] = windows["costs_to_go"][:, -1] / 10.0
        return mean, np.full((batch, 2), -1.0)

    return EpisodePolicy(
        predict, context_len=4, action_dim=2, action_low=[-1, -1], action_high=[1, 1]
    )


def test_run_episodes_keeps_algorithm_2_budgets() -> None:
    seen: list[dict[str, np.ndarray]] = []
    spec = EpisodeSpec(seed=3, target_reward=5.0, target_cost=8.0, deterministic=True)
    (result,) = run_episodes(
        recording_policy(seen), "toy", [spec], record_steps=True, env_factory=toy_env_factory
    )
    assert result.length == 12 and len(result.step_costs) == 12
    assert result.cost == sum(result.step_costs)
    assert len(result.step_rewards) == 12
    assert result.reward == pytest.approx(sum(result.step_rewards))
    # C_{t+1} = max(C_t - c_t, 0): the newest cost-to-go seen at step t is 8 - cost so far.
    newest = [window["costs_to_go"][0, -1] for window in seen]
    spent = np.concatenate([[0.0], np.cumsum(result.step_costs)[:-1]])
    np.testing.assert_allclose(newest, np.maximum(8.0 - spent, 0.0))
    assert seen[0]["padding_mask"][0].tolist() == [True, True, True, False]


def test_run_episodes_applies_a_budget_change_before_that_steps_action() -> None:
    seen: list[dict[str, np.ndarray]] = []
    specs = [
        EpisodeSpec(seed=1, target_reward=0.0, target_cost=40.0, deterministic=True),
        EpisodeSpec(1, 0.0, 40.0, deterministic=True, cost_schedule=((5, 0.0),)),
    ]
    control, changed = run_episodes(
        recording_policy(seen), "toy", specs, env_factory=toy_env_factory
    )
    assert seen[4]["costs_to_go"][1, -1] > 0.0  # step 4: both still at the old budget
    assert seen[5]["costs_to_go"][1, -1] == 0.0  # step 5's action already sees the new one
    assert changed.cost < control.cost  # a zero budget drives the cost-taking action to 0


def test_run_episodes_same_seed_same_sampled_episode() -> None:
    specs = [EpisodeSpec(seed=7, target_reward=0.0, target_cost=10.0)] * 2
    first, second = run_episodes(recording_policy([]), "toy", specs, env_factory=toy_env_factory)
    assert (first.reward, first.cost) == (second.reward, second.cost)


def test_run_episodes_scales_each_cost_input_at_the_episodes_current_budget() -> None:
    """The calibration follows a budget change: the factor is looked up at the new limit."""
    seen: list[dict[str, np.ndarray]] = []
    asked: list[tuple[bool, float]] = []

    def by_budget(deterministic: bool, budget: float) -> float:
        asked.append((deterministic, budget))
        return {8.0: 2.0, 20.0: 0.5}[budget] if deterministic else 1.0

    policy = dataclasses.replace(recording_policy(seen), cost_input_scale=by_budget)
    specs = [
        EpisodeSpec(3, 5.0, 8.0, deterministic=True, cost_schedule=((4, 20.0),)),
        EpisodeSpec(3, 5.0, 8.0, deterministic=False, cost_schedule=((4, 20.0),)),
    ]
    mean, sampled = run_episodes(
        policy, "toy", specs, record_steps=True, env_factory=toy_env_factory
    )
    spent = np.concatenate([[0.0], np.cumsum(mean.step_costs)[:-1]])
    budgets = np.where(np.arange(len(seen)) < 4, 8.0, 20.0)
    factors = np.where(budgets == 8.0, 2.0, 0.5)
    newest = [window["costs_to_go"][0, -1] for window in seen]
    np.testing.assert_allclose(newest, factors * np.maximum(budgets - spent, 0.0), rtol=1e-6)
    assert {budget for deterministic, budget in asked if deterministic} == {8.0, 20.0}
    spent = np.concatenate([[0.0], np.cumsum(sampled.step_costs)[:-1]])
    newest = [window["costs_to_go"][1, -1] for window in seen]
    np.testing.assert_allclose(newest, np.maximum(budgets - spent, 0.0), rtol=1e-6)
