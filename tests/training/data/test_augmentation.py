"""Return relabelling (paper Algorithm 1 and the appendix's robustness techniques)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from training.data.augmentation import (
    augment_returns,
    best_under_cost,
    density_filter,
    relabel_to_go,
    sample_infeasible_targets,
    sampled_association,
)

# (cost, reward) per trajectory; the Pareto frontier is 0, 1, 3, 4 (2 is dominated by 1)
COSTS = np.array([0.0, 5.0, 10.0, 12.0, 30.0])
REWARDS = np.array([10.0, 30.0, 20.0, 50.0, 40.0])


@pytest.mark.parametrize(
    ("target_cost", "expected"),
    [(0.0, 0), (4.9, 0), (5.0, 1), (11.0, 1), (12.0, 3), (29.0, 3), (100.0, 3)],
)
def test_best_under_cost_picks_highest_reward_within_cost(target_cost: float, expected: int):
    chosen = best_under_cost(REWARDS, COSTS, np.array([target_cost]))
    assert chosen.tolist() == [expected]


def test_best_under_cost_breaks_reward_ties_towards_lower_cost():
    costs, rewards = np.array([2.0, 7.0]), np.array([50.0, 50.0])
    assert best_under_cost(rewards, costs, np.array([9.0])).tolist() == [0]


def test_sample_infeasible_targets_lie_above_every_trajectory_within_their_cost():
    rng = np.random.default_rng(0)
    targets = sample_infeasible_targets(REWARDS, COSTS, 500, rng, min_gap=1.0, max_reward=80.0)
    assert targets.shape == (500, 2)
    costs, rewards = targets[:, 0], targets[:, 1]
    assert costs.min() >= COSTS.min() and costs.max() <= COSTS.max()
    for cost, reward in targets:
        reachable = REWARDS[COSTS <= cost]
        assert reward >= reachable.max() + 1.0  # above the frontier: no trajectory reaches it
    assert rewards.max() <= 80.0 + 1e-9


def test_relabel_to_go_shifts_elementwise_to_the_target():
    to_go = np.array([6.0, 5.0, 3.0, 0.5])
    relabelled = relabel_to_go(to_go, 10.0)
    np.testing.assert_allclose(relabelled, [10.0, 9.0, 7.0, 4.5])
    np.testing.assert_allclose(np.diff(relabelled), np.diff(to_go))  # per-step values kept


def test_sampled_association_follows_inverse_distance_weights():
    # anchor (best under cost 10) is trajectory 0; trajectory 1 is 5 away; 2 is too costly;
    # 3 is cheap enough but below the allowed reward drop
    costs = np.array([10.0, 7.0, 11.0, 0.0])
    rewards = np.array([100.0, 96.0, 200.0, 10.0])
    rng = np.random.default_rng(1)
    chosen = sampled_association(
        rewards, costs, np.full(6000, 10.0), rng, beta=1.0, max_reward_drop=20.0
    )
    counts = Counter(chosen.tolist())
    assert set(counts) == {0, 1}
    expected = 1.0 / (1.0 + 1.0 / 6.0)  # weights 1/(0 + 1) and 1/(5 + 1)
    assert counts[0] / len(chosen) == pytest.approx(expected, abs=0.02)


def test_sampled_association_spreads_copies_over_near_frontier_trajectories():
    rng = np.random.default_rng(2)
    costs = rng.uniform(0, 20, 80)
    rewards = 10 + 2 * costs + rng.normal(0, 1, 80)
    best = augment_returns(rewards, costs, 300, np.random.default_rng(3), association="best")
    sampled = augment_returns(
        rewards, costs, 300, np.random.default_rng(3), association="sampled", max_reward_drop=5.0
    )
    best_sources = Counter(relabel.source for relabel in best)
    sampled_sources = Counter(relabel.source for relabel in sampled)
    assert len(sampled_sources) > len(best_sources)
    assert max(sampled_sources.values()) < max(best_sources.values())
    for relabel in sampled:
        assert costs[relabel.source] <= relabel.cost_return  # within the target's budget


def test_density_filter_drops_isolated_trajectories_only():
    rng = np.random.default_rng(4)
    costs = np.concatenate([rng.uniform(0, 10, 50), [100.0]])
    rewards = np.concatenate([rng.uniform(0, 10, 50), [100.0]])
    keep = density_filter(rewards, costs, bins=(2, 2), min_count=2)
    assert not keep[-1]
    assert keep[:-1].all()


def test_augment_returns_relabels_towards_costlier_and_more_rewarding_targets():
    rng = np.random.default_rng(5)
    relabels = augment_returns(REWARDS, COSTS, 40, rng, association="best")
    assert len(relabels) == 40
    for relabel in relabels:
        assert relabel.cost_return >= COSTS[relabel.source]  # costs-to-go stay >= 0
        assert relabel.reward_return > REWARDS[relabel.source]


def test_augment_returns_default_max_reward_exceeds_best_return():
    relabels = augment_returns(REWARDS, COSTS, 200, np.random.default_rng(6))
    assert max(relabel.reward_return for relabel in relabels) > REWARDS.max()
    assert max(relabel.reward_return for relabel in relabels) <= REWARDS.max() + 0.1 * 40 + 1


def test_augment_returns_rejects_unknown_association():
    with pytest.raises(ValueError, match="association"):
        augment_returns(REWARDS, COSTS, 3, np.random.default_rng(0), association="nearest")


def test_sample_infeasible_targets_cap_their_cost_where_budgets_are_served():
    rewards = np.array([0.0, 50.0, 100.0, 150.0])
    costs = np.array([0.0, 40.0, 120.0, 260.0])
    targets = sample_infeasible_targets(
        rewards, costs, 500, np.random.default_rng(0), min_gap=1.0, max_reward=200.0, max_cost=60.0
    )
    assert targets[:, 0].min() >= 0.0
    assert targets[:, 0].max() <= 60.0
    assert targets[:, 0].max() > 50.0  # the whole capped range is used


def test_relabel_to_go_keeps_the_dtype():
    relabelled = relabel_to_go(np.array([3.0, 2.0, 1.0], dtype=np.float32), 10.5)
    assert relabelled.dtype == np.float32
    np.testing.assert_allclose(relabelled, [10.5, 9.5, 8.5])
