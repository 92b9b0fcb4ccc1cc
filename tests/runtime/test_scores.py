"""Normalised scores (paper section 5), the one definition every evaluation uses."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.scores import COST_EPSILON, normalised_cost, normalised_reward, over_limit


def test_normalised_scores_follow_the_paper() -> None:
    reward = normalised_reward(np.array([50.0, 150.0]), (50.0, 150.0))
    cost = normalised_cost(np.array([0.0, 20.0]), 10.0)
    np.testing.assert_allclose(reward, [0.0, 100.0])
    np.testing.assert_allclose(cost, [0.0, 20.0 / (10.0 + COST_EPSILON)])


def test_normalised_scores_take_plain_floats_and_a_zero_budget() -> None:
    assert normalised_reward(75.0, (50.0, 150.0)) == pytest.approx(25.0)
    assert normalised_cost(1.0, 0.0) == pytest.approx(1.0 / COST_EPSILON)


def test_over_limit_forgives_rounding_of_summed_costs_only() -> None:
    summed = 0.1 + 0.1 + 0.1  # 0.30000000000000004
    assert summed > 0.3 and not over_limit(summed, 0.3)
    assert over_limit(0.31, 0.3) and over_limit(1.0, 0.0) and not over_limit(0.0, 0.0)
    assert over_limit(np.array([10.0, 11.0, 10.0 + 1e-12]), 10.0).tolist() == [False, True, False]
