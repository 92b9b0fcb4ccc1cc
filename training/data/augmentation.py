"""CDT's data augmentation by return relabelling, as pure numpy functions.

Paper: Liu et al. 2023, section 4.4 and Algorithm 1, plus the appendix techniques for noisy data
(sampling-based association and the density filter). Everything works on per-trajectory returns:
`reward_returns[i]` and `cost_returns[i]` are the reward and cost return of trajectory i. The
frontier helpers are the dataset analysis' own (training/data/frontiers.py), so augmentation
relabels towards exactly the frontier `cdt dataset inspect` reports.

Algorithm 1 in short: sample N targets (c, r) that no trajectory in the data can reach (r above the
reward frontier at cost c); the best achievable behaviour for such a target is the highest-reward
trajectory whose cost stays within c, so that trajectory's returns-to-go and costs-to-go are shifted
element-wise to start at (r, c) and the copy is appended to the data.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from training.data.frontiers import pareto_frontier_curve, pareto_indices
from training.data.grid_filter import grid_cells


class Relabel(NamedTuple):
    """One augmented trajectory: a copy of trajectory `source`, its returns starting at targets."""

    source: int
    reward_return: float
    cost_return: float


def best_under_cost(
    reward_returns: np.ndarray, cost_returns: np.ndarray, target_costs: np.ndarray
) -> np.ndarray:
    """For every target cost, the trajectory of highest reward among those with cost <= target.

    Ties in reward go to the lower cost. Targets below every cost map to the cheapest trajectory.
    """
    frontier = pareto_indices(cost_returns, reward_returns)
    frontier_costs = cost_returns[frontier]
    # the last frontier point with cost <= target has the highest reward under that cost
    position = np.searchsorted(frontier_costs, target_costs, side="right") - 1
    chosen: np.ndarray = frontier[np.clip(position, 0, len(frontier) - 1)]
    return chosen


def sampled_association(
    reward_returns: np.ndarray,
    cost_returns: np.ndarray,
    target_costs: np.ndarray,
    rng: np.random.Generator,
    beta: float,
    max_reward_drop: float,
) -> np.ndarray:
    """Sampling-based association (paper appendix, robustness to noisy data).

    Around the best trajectory b = best_under_cost(target), every trajectory j with
    C_j <= target cost and R_j >= R_b - max_reward_drop is a candidate, drawn with probability
    proportional to 1 / (||(C_j, R_j) - (C_b, R_b)|| + beta). Many targets no longer pile onto the
    one frontier trajectory (a mislabelled one, in noisy data), and every copy stays within budget.
    Deviation: OSRL's candidates must cost no more than b itself; bounding them by the target cost
    keeps the same guarantee (relabelled costs-to-go stay >= 0) with more candidates.
    """
    best = best_under_cost(reward_returns, cost_returns, target_costs)
    chosen = np.empty_like(best)
    for row, (anchor, target_cost) in enumerate(zip(best, target_costs, strict=True)):
        candidates = np.flatnonzero(
            (cost_returns <= max(target_cost, cost_returns[anchor]))
            & (reward_returns >= reward_returns[anchor] - max_reward_drop)
        )
        distance = np.hypot(
            cost_returns[candidates] - cost_returns[anchor],
            reward_returns[candidates] - reward_returns[anchor],
        )
        weights = 1.0 / (distance + beta)
        chosen[row] = rng.choice(candidates, p=weights / weights.sum())
    return chosen


def sample_infeasible_targets(
    reward_returns: np.ndarray,
    cost_returns: np.ndarray,
    count: int,
    rng: np.random.Generator,
    min_gap: float,
    max_reward: float,
    max_cost: float | None = None,
) -> np.ndarray:
    """Draw `count` (cost, reward) targets above the reward frontier; returns [count, 2].

    Costs are uniform over the dataset's cost-return range, or up to `max_cost` where that is
    lower; rewards are uniform in [RF(c) + min_gap, max(RF(c) + min_gap, max_reward)], so no
    target is reachable by the data.
    """
    low_cost, high_cost = float(cost_returns.min()), float(cost_returns.max())
    if max_cost is not None:
        high_cost = max(low_cost, min(high_cost, max_cost))
    target_costs = rng.uniform(low_cost, high_cost, size=count)
    # PF(c): the best reward any trajectory with cost <= c reaches; nothing in the data is above it.
    low = pareto_frontier_curve(cost_returns, reward_returns, target_costs) + min_gap
    high = np.maximum(low, max_reward)
    target_rewards = low + rng.uniform(0.0, 1.0, size=count) * (high - low)
    return np.stack([target_costs, target_rewards], axis=1)  # [count, 2], (cost, reward)


def relabel_to_go(to_go: np.ndarray, target_return: float) -> np.ndarray:
    """Shift a return-to-go sequence element-wise so that it starts at `target_return`."""
    shifted: np.ndarray = to_go + to_go.dtype.type(target_return - to_go[0])
    return shifted


def density_filter(
    reward_returns: np.ndarray,
    cost_returns: np.ndarray,
    bins: tuple[int, int],
    min_count: int,
) -> np.ndarray:
    """Density filter: False for trajectories in return-grid cells with <= min_count members.

    Paper appendix (noisy datasets): outliers sit in sparse regions of the return plane, and
    removing them keeps them from defining the frontier that augmentation relabels towards. The
    grid is the dataset grid filter's (training/data/grid_filter.py), over the data's own ranges.
    """
    cost_bins, reward_bins = bins
    cells = grid_cells(cost_returns, reward_returns, cost_bins, reward_bins)
    counts = np.bincount(cells, minlength=cost_bins * reward_bins)
    keep: np.ndarray = counts[cells] > min_count
    return keep


def augment_returns(
    reward_returns: np.ndarray,
    cost_returns: np.ndarray,
    count: int,
    rng: np.random.Generator,
    *,
    min_gap: float = 1.0,
    max_reward: float | None = None,
    max_cost: float | None = None,
    association: str = "sampled",
    beta: float = 1.0,
    max_reward_drop: float = np.inf,
) -> list[Relabel]:
    """Algorithm 1: pick `count` infeasible targets and the trajectory each one relabels.

    Args:
        max_reward: highest target reward; None uses max reward return + 10% of the reward range.
        max_cost: highest target cost; None uses the data's largest cost return (Algorithm 1).
        association: "best" (Algorithm 1) or "sampled" (the appendix's sampling-based association).
    """
    if count <= 0 or len(reward_returns) == 0:
        return []
    if max_reward is None:
        spread = float(reward_returns.max() - reward_returns.min())
        max_reward = float(reward_returns.max()) + 0.1 * spread
    targets = sample_infeasible_targets(
        reward_returns, cost_returns, count, rng, min_gap, max_reward, max_cost
    )
    if association == "best":
        sources = best_under_cost(reward_returns, cost_returns, targets[:, 0])
    elif association == "sampled":
        sources = sampled_association(
            reward_returns, cost_returns, targets[:, 0], rng, beta, max_reward_drop
        )
    else:
        raise ValueError(f"unknown association {association!r} (expected 'best' or 'sampled')")
    return [
        Relabel(int(source), float(reward), float(cost))
        for source, (cost, reward) in zip(sources, targets, strict=True)
    ]
