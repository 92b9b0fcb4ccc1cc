"""Normalised scores (paper section 5), shared by `cdt rollout` and `cdt evaluate`."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

COST_EPSILON = 0.1
"""Added to kappa in the normalised cost C / (kappa + eps) so that kappa = 0 stays defined."""

Score = TypeVar("Score", float, npt.NDArray[np.float64])


COST_TOLERANCE = 1e-9
"""Relative slack of `over_limit`: costs are summed step by step, and fractional ones (0.1 + 0.1 +
0.1) land a rounding error past a limit (0.3) they meet exactly."""


def over_limit(cost: Score, limit: float) -> npt.NDArray[np.bool_]:
    """Whether `cost` exceeds `limit` by more than rounding (elementwise for arrays): an episode
    over budget."""
    return np.asarray(np.greater(cost, limit + COST_TOLERANCE * max(1.0, abs(limit))))


def normalised_reward(reward: Score, reward_range: tuple[float, float]) -> Score:
    """100 (R - r_min) / (r_max - r_min) over the dataset's reward returns."""
    low, high = reward_range
    return (reward - low) / max(high - low, 1e-8) * 100.0


def normalised_cost(cost: Score, kappa: float) -> Score:
    """C / (kappa + eps); safe means <= 1."""
    return cost / (kappa + COST_EPSILON)
