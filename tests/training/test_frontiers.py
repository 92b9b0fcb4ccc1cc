"""Frontiers and epsilon against values computed by hand on a seven-trajectory dataset."""

from __future__ import annotations

import math

import numpy as np
import pytest

from training.frontiers import (
    epsilon_reducible,
    inverse_pareto_frontier,
    inverse_pareto_frontier_curve,
    normalised_epsilon_reducible,
    pareto_frontier,
    pareto_frontier_curve,
    pareto_indices,
    pareto_points,
    reduce_indices,
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
        (10.0, 150.0, 400.0),  # safe: 0, 1, 2 (C = 10 counts as safe); unsafe best: 5
        (20.0, 300.0, 400.0),
        (40.0, 400.0, 390.0),  # only trajectory 6 is unsafe
        (0.0, 100.0, 400.0),
    ],
)
def test_pareto_and_inverse_frontier_match_hand_values(threshold, pf, ipf):
    assert pareto_frontier(COSTS, REWARDS, threshold) == pf
    assert inverse_pareto_frontier(COSTS, REWARDS, threshold) == ipf


def test_frontiers_over_an_empty_side_are_nan():
    assert math.isnan(pareto_frontier(COSTS, REWARDS, -1.0))  # nothing is that safe
    assert math.isnan(inverse_pareto_frontier(COSTS, REWARDS, 45.0))  # nothing is unsafe
    assert math.isnan(epsilon_reducible(COSTS, REWARDS, 45.0))
    assert math.isnan(pareto_frontier([], [], 10.0))


@pytest.mark.parametrize(
    ("threshold", "epsilon", "normalised"),
    [(10.0, 250.0, 0.625), (20.0, 100.0, 0.25), (40.0, -10.0, -0.025)],
)
def test_epsilon_reducible_is_ipf_minus_pf_over_max_reward(threshold, epsilon, normalised):
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
        assert inverse_pareto_frontier(costs, rewards, kappa) == best[centres > kappa].max()


def test_curves_agree_with_the_scalar_definitions():
    kappas = np.array([-1.0, 0.0, 4.9, 5.0, 11.0, 44.0, 45.0, 100.0])
    pf = pareto_frontier_curve(COSTS, REWARDS, kappas)
    ipf = inverse_pareto_frontier_curve(COSTS, REWARDS, kappas)
    for kappa, pf_value, ipf_value in zip(kappas, pf, ipf, strict=True):
        safe, unsafe = REWARDS[COSTS <= kappa], REWARDS[COSTS > kappa]
        np.testing.assert_equal(pf_value, safe.max() if safe.size else np.nan)
        np.testing.assert_equal(ipf_value, unsafe.max() if unsafe.size else np.nan)


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


def test_reduce_drops_safe_trajectories_in_the_band_under_pf():
    # PF(10) = 150; epsilon 20 drops safe rewards in [130, 150]: trajectories 1 and 2
    kept = reduce_indices(COSTS, REWARDS, 10.0, 20.0)
    np.testing.assert_array_equal(kept, [0, 3, 4, 5, 6])
    before = epsilon_reducible(COSTS, REWARDS, 10.0)
    after = epsilon_reducible(COSTS[kept], REWARDS[kept], 10.0)
    assert (before, after) == (250.0, 300.0)
    assert after > before + 20.0


def test_reduce_band_includes_its_lower_edge():
    # epsilon 50: the band is [100, 150], so trajectory 0 (reward exactly 100) goes too
    np.testing.assert_array_equal(reduce_indices(COSTS, REWARDS, 10.0, 50.0), [3, 4, 5, 6])


def test_reduce_keeps_everything_without_safe_trajectories_and_rejects_bad_epsilon():
    np.testing.assert_array_equal(reduce_indices(COSTS, REWARDS, -1.0, 10.0), np.arange(7))
    with pytest.raises(ValueError, match="epsilon"):
        reduce_indices(COSTS, REWARDS, 10.0, 0.0)


def test_summarise_frontiers_collects_every_value_per_threshold():
    rows = summarise_frontiers(COSTS, REWARDS, [10, 40])
    assert [row.threshold for row in rows] == [10.0, 40.0]
    first = rows[0]
    assert (first.pareto_frontier, first.inverse_pareto_frontier) == (150.0, 400.0)
    assert (first.reward_frontier, first.epsilon, first.safe_episodes) == (140.0, 250.0, 3)
    assert first.normalised_epsilon == pytest.approx(0.625)


@pytest.mark.parametrize(
    ("costs", "rewards"),
    [([1.0, 2.0], [1.0]), ([[1.0]], [[1.0]]), ([1.0, np.nan], [1.0, 2.0])],
)
def test_returns_must_be_finite_1d_and_of_one_length(costs, rewards):
    with pytest.raises(ValueError, match="returns"):
        pareto_frontier(costs, rewards, 10.0)
