"""The grid filter: thin out a dataset evenly over the (cost return, reward return) plane.

Collection keeps every rollout of a Lagrangian training run, so most trajectories pile up where the
policy spent most epochs. The CDT paper (appendix, "Dataset Collection") and DSRL therefore split
the plane into a ``cost_bins x reward_bins`` grid and keep at most N trajectories per cell, chosen
at random. ``cdt collect`` calls ``grid_filter`` before writing the HDF5 file; ``cdt dataset
filter`` does the same to an existing file.

Deviations from DSRL's ``grid_filter``
(https://github.com/liuzuxin/DSRL/blob/1b0d005b0e310c585cd67b22451733bf281cd0ce/dsrl/offline_env.py):
- a trajectory exactly at the top of a range goes in the last cell, not an extra one;
- cells are visited in index order and sampled with a ``numpy.random.Generator``, so a seed gives
  one result;
- DSRL's default drops cells holding a single trajectory (``min_num_per_bin=1``); here
  ``min_per_cell`` defaults to 1, keeping every cell (pass 2 for DSRL's behaviour).
"""

from __future__ import annotations

import logging

import numpy as np
from numpy.typing import ArrayLike

from training.data.frontiers import paired_returns

logger = logging.getLogger(__name__)


def _bin_index(
    values: np.ndarray, bins: int, value_range: tuple[float, float] | None
) -> np.ndarray:
    """The bin of each value in ``bins`` equal bins over the range; -1 outside the range."""
    if bins < 1:
        raise ValueError(f"the number of bins must be >= 1, got {bins}")
    if value_range is None:
        low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    else:
        low, high = value_range
        if high < low:
            raise ValueError(f"a range must be (low, high) with low <= high, got {value_range}")
    width = (high - low) / bins
    if width > 0:
        index = np.floor((values - low) / width).astype(np.int64)
    else:  # a single value: everything in range sits in bin 0
        index = np.zeros(values.shape, dtype=np.int64)
    index = np.minimum(index, bins - 1)  # the top edge belongs to the last bin
    outside = (values < low) | (values > high)
    index[outside] = -1
    return index


def grid_cells(
    cost_returns: ArrayLike,
    reward_returns: ArrayLike,
    cost_bins: int,
    reward_bins: int,
    *,
    cost_range: tuple[float, float] | None = None,
    reward_range: tuple[float, float] | None = None,
) -> np.ndarray:
    """The grid cell of each trajectory: ``cost_bin * reward_bins + reward_bin``, -1 if outside.

    Ranges default to the data's own minimum and maximum.
    """
    costs, rewards = paired_returns(cost_returns, reward_returns)
    cost_index = _bin_index(costs, cost_bins, cost_range)
    reward_index = _bin_index(rewards, reward_bins, reward_range)
    cells: np.ndarray = cost_index * reward_bins + reward_index
    cells[(cost_index < 0) | (reward_index < 0)] = -1
    return cells


def grid_filter(
    cost_returns: ArrayLike,
    reward_returns: ArrayLike,
    cost_bins: int,
    reward_bins: int,
    max_per_cell: int,
    *,
    rng: np.random.Generator,
    min_per_cell: int = 1,
    cost_range: tuple[float, float] | None = None,
    reward_range: tuple[float, float] | None = None,
) -> np.ndarray:
    """Keep at most ``max_per_cell`` trajectories (a random choice) in each grid cell.

    Args:
        cost_returns: ``[num_episodes]``; likewise ``reward_returns``.
        rng: picks which trajectories a full cell keeps.
        min_per_cell: cells holding fewer trajectories are dropped whole (1 keeps every cell).
        cost_range: ``(low, high)`` of the grid's cost axis; trajectories outside are dropped.
        reward_range: ``(low, high)`` of the grid's reward axis; likewise.

    Returns:
        int64 indices of the kept trajectories, in ascending order.
    """
    if max_per_cell < 1 or min_per_cell < 1:
        raise ValueError(
            f"max_per_cell and min_per_cell must be >= 1: {max_per_cell}, {min_per_cell}"
        )
    cells = grid_cells(
        cost_returns,
        reward_returns,
        cost_bins,
        reward_bins,
        cost_range=cost_range,
        reward_range=reward_range,
    )
    indices = _sample_cells(cells, max_per_cell, min_per_cell, rng)
    logger.info("grid filter kept %d of %d trajectories", indices.size, cells.size)
    return indices


def _sample_cells(
    cells: np.ndarray, max_per_cell: int, min_per_cell: int, rng: np.random.Generator
) -> np.ndarray:
    """Visit the occupied cells in index order; keep all, a random subset, or none of each."""
    kept: list[np.ndarray] = []
    for cell in np.unique(cells[cells >= 0]):
        members = np.flatnonzero(cells == cell)
        if members.size < min_per_cell:
            continue
        if members.size > max_per_cell:
            members = rng.choice(members, size=max_per_cell, replace=False)
        kept.append(members)
    indices = np.sort(np.concatenate(kept)) if kept else np.empty(0, dtype=np.int64)
    return indices.astype(np.int64)
