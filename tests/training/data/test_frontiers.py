"""Frontiers and epsilon against values computed by hand on a seven-trajectory dataset.

The paper's definitions: PF(kappa) = max R over C <= kappa, IPF(kappa) = max R over C >= kappa,
epsilon = PF - IPF. The dataset's best trajectory (reward 400, cost 30) is unsafe at kappa = 10,
so epsilon(10) < 0 there.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from training.data.frontiers import (
    epsilon_reducible,
    inverse_pareto_frontier,
    inverse_pareto_frontier_curve,
    normalised_epsilon_reducible,
    pareto_frontier,
    pareto_frontier_curve,
    pareto_indices,
    pareto_points,
    reduce_indices,
    reduce_level,
    reward_frontier,
    reward_frontier_curve,
    summarise_frontiers,
)

# index:        0    1    2    3    4    5    6
COSTS = np.array([0.0, 5.0, 10.0, 12.0, 20.0, 30.0, 45.0])
REWARDS = np.array([100.0, 150.0, 140.0, 300.0, 250.0, 400.0, 390.0])


@pytest.mark.parametrize(
    ("threshold", "pf", "ipf"),
    [
        (10.0, 150.0, 400.0),  # safe: 0, 1, 2 (C = 10 counts as safe); IPF over 2..6: 5
        (20.0, 300.0, 400.0),
        (40.0, 400.0, 390.0),  # only trajectory 6 has C >= 40
        (45.0, 400.0, 390.0),  # IPF's C >= kappa: trajectory 6 (C = 45) is in PF and in IPF
        (30.0, 400.0, 400.0),  # trajectory 5 (C = 30) is the best of both: epsilon 0
        (0.0, 100.0, 400.0),
    ],
)
def test_pareto_and_inverse_frontier_match_hand_values(threshold, pf, ipf):
    assert pareto_frontier(COSTS, REWARDS, threshold) == pf
    assert inverse_pareto_frontier(COSTS, REWARDS, threshold) == ipf


def test_frontiers_over_an_empty_side_are_nan():
    assert math.isnan(pareto_frontier(COSTS, REWARDS, -1.0))  # nothing is that safe
    assert math.isnan(inverse_pareto_frontier(COSTS, REWARDS, 45.5))  # nothing has C >= 45.5
    assert math.isnan(epsilon_reducible(COSTS, REWARDS, 45.5))
    assert math.isnan(pareto_frontier([], [], 10.0))


@pytest.mark.parametrize(
    ("threshold", "epsilon", "normalised"),
    [(10.0, -250.0, -0.625), (20.0, -100.0, -0.25), (30.0, 0.0, 0.0), (40.0, 10.0, 0.025)],
)
def test_epsilon_reducible_is_pf_minus_ipf_over_max_reward(threshold, epsilon, normalised):
    # the paper: PF(kappa) = IPF(kappa) + epsilon, normalised by the maximum reward return (400)
    assert epsilon_reducible(COSTS, REWARDS, threshold) == pytest.approx(epsilon)
    assert normalised_epsilon_reducible(COSTS, REWARDS, threshold) == pytest.approx(normalised)


def test_normalised_epsilon_is_nan_without_a_positive_reward():
    assert math.isnan(normalised_epsilon_reducible([0.0, 20.0], [-5.0, -1.0], 10.0))


def test_reward_frontier_is_the_best_reward_in_the_cost_bin():
    costs = np.array([10.0, 10.0, 10.4, 9.6, 11.0])
    rewards = np.array([5.0, 7.0, 9.0, 8.0, 50.0])
    assert reward_frontier(costs, rewards, 10.0) == 9.0  # [9.5, 10.5) holds 10, 10, 10.4, 9.6
    assert reward_frontier(costs, rewards, 10.0, bin_width=0.1) == 7.0  # only the exact 10s
    assert math.isnan(reward_frontier(COSTS, REWARDS, 11.0))
    with pytest.raises(ValueError, match="bin_width"):
        reward_frontier(costs, rewards, 10.0, bin_width=0.0)


def test_reward_frontier_curve_lists_non_empty_bins_in_cost_order():
    centres, best = reward_frontier_curve([3.0, 0.2, 3.4, 7.0], [1.0, 4.0, 6.0, 2.0])
    np.testing.assert_array_equal(centres, [0.0, 3.0, 7.0])
    np.testing.assert_array_equal(best, [4.0, 6.0, 2.0])


def test_pf_and_ipf_are_running_maxima_of_rf():
    rng = np.random.default_rng(0)
    costs = rng.integers(0, 30, size=200).astype(float)
    rewards = rng.normal(100.0, 30.0, size=200)
    centres, best = reward_frontier_curve(costs, rewards)
    for kappa in (0.0, 7.0, 15.0, 28.0):
        assert pareto_frontier(costs, rewards, kappa) == best[centres <= kappa].max()
        assert inverse_pareto_frontier(costs, rewards, kappa) == best[centres >= kappa].max()


def test_curves_agree_with_the_scalar_definitions():
    kappas = np.array([-1.0, 0.0, 4.9, 5.0, 11.0, 44.0, 45.0, 100.0])
    pf = pareto_frontier_curve(COSTS, REWARDS, kappas)
    ipf = inverse_pareto_frontier_curve(COSTS, REWARDS, kappas)
    for kappa, pf_value, ipf_value in zip(kappas, pf, ipf, strict=True):
        safe, beyond = REWARDS[COSTS <= kappa], REWARDS[COSTS >= kappa]
        np.testing.assert_equal(pf_value, safe.max() if safe.size else np.nan)
        np.testing.assert_equal(ipf_value, beyond.max() if beyond.size else np.nan)


def test_pareto_indices_are_the_non_dominated_trajectories_by_cost():
    np.testing.assert_array_equal(pareto_indices(COSTS, REWARDS), [0, 1, 3, 5])
    costs, rewards = pareto_points(COSTS, REWARDS)
    np.testing.assert_array_equal(costs, [0.0, 5.0, 12.0, 30.0])
    np.testing.assert_array_equal(rewards, [100.0, 150.0, 300.0, 400.0])


def test_pareto_indices_keep_exact_duplicates_and_drop_equal_cost_losers():
    costs = [5.0, 5.0, 5.0, 1.0, 9.0]
    rewards = [150.0, 150.0, 120.0, 150.0, 151.0]
    # (5, 150) is dominated by (1, 150): equal reward at lower cost
    np.testing.assert_array_equal(pareto_indices(costs, rewards), [3, 4])
    np.testing.assert_array_equal(pareto_indices([2.0, 2.0], [7.0, 7.0]), [0, 1])


def _dominated_brute_force(costs: np.ndarray, rewards: np.ndarray) -> set[int]:
    dominated = set()
    for i in range(costs.size):
        for j in range(costs.size):
            no_worse = costs[j] <= costs[i] and rewards[j] >= rewards[i]
            if no_worse and (costs[j] < costs[i] or rewards[j] > rewards[i]):
                dominated.add(i)
    return dominated


def test_pareto_indices_match_a_brute_force_definition():
    rng = np.random.default_rng(1)
    costs = rng.integers(0, 15, size=120).astype(float)
    rewards = rng.integers(0, 40, size=120).astype(float)
    expected = set(range(120)) - _dominated_brute_force(costs, rewards)
    assert set(pareto_indices(costs, rewards).tolist()) == expected


# COSTS / REWARDS plus an unsafe trajectory that does not out-reward the threshold (index 7)
# and one far below it (index 8)
REDUCE_COSTS = np.append(COSTS, [25.0, 60.0])
REDUCE_REWARDS = np.append(REWARDS, [120.0, -20.0])


def test_reduce_drops_the_unsafe_trajectories_that_beat_rf_at_the_threshold():
    # RF(10) = 140 (trajectory 2): unsafe 3, 4, 5, 6 (rewards 300, 250, 400, 390) go
    assert reduce_level(REDUCE_COSTS, REDUCE_REWARDS, 10.0) == 140.0
    kept = reduce_indices(REDUCE_COSTS, REDUCE_REWARDS, 10.0)
    np.testing.assert_array_equal(kept, [0, 1, 2, 7, 8])
    costs, rewards = REDUCE_COSTS[kept], REDUCE_REWARDS[kept]
    assert epsilon_reducible(REDUCE_COSTS, REDUCE_REWARDS, 10.0) == -250.0  # full: negative
    # reduced: PF 150 > IPF 140 (trajectory 2, C = 10, is in IPF), the paper's positive epsilon
    assert pareto_frontier(costs, rewards, 10.0) == 150.0
    assert inverse_pareto_frontier(costs, rewards, 10.0) == 140.0
    assert epsilon_reducible(costs, rewards, 10.0) == 10.0
    assert normalised_epsilon_reducible(costs, rewards, 10.0) == pytest.approx(10.0 / 150.0)


def test_reduce_keeps_every_safe_trajectory():
    rng = np.random.default_rng(2)
    costs = rng.integers(0, 40, size=300).astype(float)
    rewards = rng.normal(100.0, 40.0, size=300) + 2.0 * costs  # unsafe ones pay more
    for kappa in (5.0, 10.0, 20.0):
        assert epsilon_reducible(costs, rewards, kappa) < 0
        kept = reduce_indices(costs, rewards, kappa)
        assert set(np.flatnonzero(costs <= kappa)) <= set(kept.tolist())
        pf = pareto_frontier(costs[kept], rewards[kept], kappa)
        assert pf == pareto_frontier(costs, rewards, kappa)
        assert pf > inverse_pareto_frontier(costs[kept], rewards[kept], kappa)
        assert epsilon_reducible(costs[kept], rewards[kept], kappa) > 0


def test_reduce_falls_back_to_pf_without_a_safe_trajectory_at_the_threshold():
    # kappa = 11: no trajectory in RF's bin [10.5, 11.5), so the level is PF(11) = 150
    assert reduce_level(REDUCE_COSTS, REDUCE_REWARDS, 11.0) == 150.0
    kept = reduce_indices(REDUCE_COSTS, REDUCE_REWARDS, 11.0)
    np.testing.assert_array_equal(kept, [0, 1, 2, 7, 8])
    assert epsilon_reducible(REDUCE_COSTS[kept], REDUCE_REWARDS[kept], 11.0) == 30.0  # 150 - 120


def test_reduce_drops_ties_with_the_level_and_counts_only_safe_trajectories_in_rf():
    # RF's bin at 10 is [9.5, 10.5): the unsafe trajectory at 10.2 does not set the level
    costs = [0.0, 10.0, 10.2, 11.0, 30.0]
    rewards = [50.0, 80.0, 500.0, 80.0, 79.0]
    assert reduce_level(costs, rewards, 10.0) == 80.0
    np.testing.assert_array_equal(reduce_indices(costs, rewards, 10.0), [0, 1, 4])


def test_reduce_keeps_everything_without_safe_trajectories():
    assert math.isnan(reduce_level(COSTS, REWARDS, -1.0))
    np.testing.assert_array_equal(reduce_indices(COSTS, REWARDS, -1.0), np.arange(7))
    # a dataset already reduced loses nothing more
    kept = reduce_indices(COSTS, REWARDS, 10.0)
    np.testing.assert_array_equal(reduce_indices(COSTS[kept], REWARDS[kept], 10.0), [0, 1, 2])


def test_summarise_frontiers_collects_every_value_per_threshold():
    rows = summarise_frontiers(COSTS, REWARDS, [10, 40])
    assert [row.threshold for row in rows] == [10.0, 40.0]
    first = rows[0]
    assert (first.pareto_frontier, first.inverse_pareto_frontier) == (150.0, 400.0)
    assert (first.reward_frontier, first.epsilon, first.safe_episodes) == (140.0, -250.0, 3)
    assert first.normalised_epsilon == pytest.approx(-0.625)


@pytest.mark.parametrize(
    ("costs", "rewards"),
    [([1.0, 2.0], [1.0]), ([[1.0]], [[1.0]]), ([1.0, np.nan], [1.0, 2.0])],
)
def test_returns_must_be_finite_1d_and_of_one_length(costs, rewards):
    with pytest.raises(ValueError, match="returns"):
        pareto_frontier(costs, rewards, 10.0)
