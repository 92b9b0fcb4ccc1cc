"""The cost critic and the budget guard's shield (runtime/cost_critic.py): loading, the
candidates, the choice, and how the guard and the episode loop ask for it."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from runtime.budget_guard import UNGUARDED, BudgetGuard, GuardAction, GuardDecision, GuardTally
from runtime.card import CardError, read_card
from runtime.cost_critic import CostCritic, CostCriticLoadError, candidates, shielded
from runtime.episodes import EpisodeSpec, run_episodes
from runtime.files import COST_CRITIC_FILE
from runtime.policy import Policy, PolicyLoadError
from tests.runtime.test_budget_guard import cost_following_policy
from tests.runtime.toy_critic import write_test_critic
from tests.runtime.toy_env import toy_env_factory
from tests.service.toy_policy import write_test_policy

BOUNDS = (np.array([-1.0, -1.0]), np.array([1.0, 1.0]))
CRITIC_RECORD = {
    "discount": 0.9, "dataset": "toy.hdf5", "update_steps": 10, "validation_mse": 0.1,
    "target_variance": 1.0,
}  # fmt: skip


@pytest.fixture
def critic(tmp_path: Path) -> CostCritic:
    write_test_critic(tmp_path, observation_dim=3, action_dim=2)  # cost = 2 a_0 + 0.1 s_0
    return CostCritic.load(tmp_path, observation_dim=3, action_dim=2)


def test_candidates_start_with_the_action_stay_in_the_box_and_never_change() -> None:
    action = np.array([0.9, -0.2])
    first = candidates(action, *BOUNDS)
    np.testing.assert_array_equal(first, candidates(action, *BOUNDS))
    np.testing.assert_allclose(first[0], action, rtol=1e-6)
    assert first.shape == (65, 2) and (np.abs(first) <= 1.0).all()
    assert len(np.unique(first.round(6), axis=0)) > 40  # offsets and spread, not one point


def test_shield_keeps_an_action_whose_predicted_cost_is_within_the_risk(
    critic: CostCritic,
) -> None:
    result = critic.shield(np.zeros(3), np.array([0.3, 0.5]), BOUNDS, risk=1.0)
    assert not result.replaced and result.action.tolist() == [0.3, 0.5]
    assert result.predicted_cost == pytest.approx(0.6)


def test_shield_replaces_a_costly_action_by_a_candidate_within_the_risk(
    critic: CostCritic,
) -> None:
    result = critic.shield(np.zeros(3), np.array([0.9, 0.5]), BOUNDS, risk=1.0)
    assert result.replaced and result.predicted_cost == pytest.approx(1.8)
    assert 2 * result.action[0] <= 1.0 + 1e-6  # predicted cost of the new action <= risk


def test_shield_measures_distance_where_one_action_dimension_is_fixed(critic: CostCritic) -> None:
    bounds = (np.array([-1.0, 0.5]), np.array([1.0, 0.5]))  # the second entry cannot move
    result = critic.shield(np.zeros(3), np.array([0.9, 0.5]), bounds, risk=1.0)
    assert result.replaced and np.isfinite(result.action).all() and result.action[1] == 0.5
    assert 2 * result.action[0] <= 1.0 + 1e-6


def test_shield_keeps_the_action_where_no_candidate_is_within_the_risk(tmp_path: Path) -> None:
    write_test_critic(tmp_path, observation_dim=3, action_dim=2, bias=10.0)  # 8 or more
    critic = CostCritic.load(tmp_path, observation_dim=3, action_dim=2)
    result = critic.shield(np.zeros(3), np.array([0.9, 0.5]), BOUNDS, risk=1.0)
    assert not result.replaced and result.action.tolist() == [0.9, 0.5]


def test_shielded_acts_only_where_the_guard_asks_and_names_what_it_did(
    critic: CostCritic,
) -> None:
    costly, observation = np.array([0.9, 0.0]), np.zeros(3)
    assert shielded(critic, observation, costly, BOUNDS, UNGUARDED) == (costly, GuardAction.NONE)
    asking = GuardDecision(GuardAction.MEAN_ACTION, 0.0, shield_risk=1.0)
    action, acted = shielded(critic, observation, costly, BOUNDS, asking)
    assert acted is GuardAction.SHIELD and action[0] <= 0.5
    calm = GuardDecision(GuardAction.MEAN_ACTION, 0.0, shield_risk=5.0)
    assert shielded(critic, observation, costly, BOUNDS, calm)[1] is GuardAction.MEAN_ACTION
    with pytest.raises(CostCriticLoadError, match="no cost critic"):
        shielded(None, observation, costly, BOUNDS, asking)


def test_load_refuses_a_graph_that_is_not_a_cost_critic(tmp_path: Path) -> None:
    write_test_policy(tmp_path / "toy", observation_dim=3, action_dim=2)
    shutil.copy(tmp_path / "toy" / "model.onnx", tmp_path / COST_CRITIC_FILE)
    with pytest.raises(CostCriticLoadError, match="expected"):
        CostCritic.load(tmp_path, observation_dim=3, action_dim=2)
    (tmp_path / COST_CRITIC_FILE).write_bytes(b"not a graph")
    with pytest.raises(CostCriticLoadError, match=COST_CRITIC_FILE):
        CostCritic.load(tmp_path, observation_dim=3, action_dim=2)


def card_with(directory: Path, **changes: object) -> None:
    path = directory / "model.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_policy_loads_the_critic_its_card_names_and_refuses_one_missing(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy", observation_dim=3, action_dim=2)
    assert Policy.load(directory).cost_critic is None
    card_with(directory, cost_critic=CRITIC_RECORD, budget_guard={"shield_margin": 15})
    with pytest.raises(PolicyLoadError, match=COST_CRITIC_FILE):
        Policy.load(directory)
    before = Policy.load  # the file arrives: loaded, and part of the fingerprint
    write_test_critic(directory, observation_dim=3, action_dim=2)
    policy = before(directory)
    assert policy.cost_critic is not None and policy.card.guard.shield_margin == 15
    write_test_critic(directory, observation_dim=3, action_dim=2, action_weight=3.0)
    assert Policy.load(directory).fingerprint != policy.fingerprint


def test_card_refuses_a_shield_without_a_cost_critic(tmp_path: Path) -> None:
    directory = write_test_policy(tmp_path / "toy", observation_dim=3, action_dim=2)
    card_with(directory, budget_guard={"shield_margin": 15})
    with pytest.raises(CardError, match="cost critic"):
        read_card(directory)


@pytest.mark.parametrize(
    ("remaining", "steps_left", "shield_risk"),
    [(20.0, 50, None), (15.0, 50, 2.0), (3.0, 50, 2.0), (-1.0, 50, 2.0), (15.0, 10, None)],
)
def test_decide_asks_for_the_shield_at_or_below_its_margin_while_the_episode_could_go_over(
    remaining: float, steps_left: int, shield_risk: float | None
) -> None:
    guard = BudgetGuard(shield_margin=15.0, hidden_reserve=0.0, fallback_margin=0.0)
    decision = guard.decide(remaining, steps_left, deterministic=True)
    assert decision.shield_risk == shield_risk  # 15 left in 10 steps cannot go over: alone
    assert BudgetGuard().decide(3.0, 50, deterministic=True).shield_risk is None  # default off


def test_run_episodes_shields_costly_actions_and_counts_the_shields_steps(tmp_path: Path) -> None:
    write_test_critic(tmp_path, observation_dim=7, action_dim=2)  # the toy env's dims
    policy = cost_following_policy([])  # a_0 = cost-to-go / 10: 0.8 at 8 left, which costs
    guard = BudgetGuard(fallback_margin=0.0, max_step_cost=0.0, hidden_reserve=0.0)
    spec = EpisodeSpec(3, 5.0, 8.0, deterministic=True, budget_guard=True)
    (alone,) = run_episodes(
        dataclasses.replace(policy, budget_guard=guard), "toy", [spec],
        env_factory=toy_env_factory,
    )  # fmt: skip
    shielding = guard.model_copy(update={"shield_margin": 10.0, "shield_risk": 0.6})
    critic = CostCritic.load(tmp_path, observation_dim=7, action_dim=2)
    (shielded_run,) = run_episodes(
        dataclasses.replace(policy, budget_guard=shielding, cost_critic=critic), "toy", [spec],
        env_factory=toy_env_factory,
    )  # fmt: skip
    assert alone.cost == 3.0 and alone.guard == GuardTally()
    assert shielded_run.cost == 0.0 and shielded_run.guard.shield == 12
