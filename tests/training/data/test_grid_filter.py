"""The grid filter on small hand-made cost/reward layouts."""

from __future__ import annotations

import numpy as np
import pytest

from training.data.grid_filter import grid_cells, grid_filter

# Four trajectories crowd the low-cost, low-reward corner; two sit in the opposite corner.
COSTS = np.array([0.0, 0.0, 1.0, 2.0, 9.0, 10.0])
REWARDS = np.array([0.0, 1.0, 0.0, 2.0, 10.0, 10.0])


def test_grid_cells_split_the_range_evenly_and_put_the_top_edge_in_the_last_cell():
    # 2 x 2 cells of width 5 on both axes; cell = cost_bin * 2 + reward_bin
    cells = grid_cells(COSTS, REWARDS, 2, 2)
    np.testing.assert_array_equal(cells, [0, 0, 0, 0, 3, 3])
    np.testing.assert_array_equal(grid_cells([0.0, 4.9, 5.0, 10.0], [0.0] * 4, 2, 1), [0, 0, 1, 1])


def test_grid_cells_outside_a_given_range_are_minus_one():
    cells = grid_cells(COSTS, REWARDS, 2, 2, cost_range=(0.0, 5.0))
    np.testing.assert_array_equal(cells, [0, 0, 0, 0, -1, -1])


def test_grid_cells_with_a_single_value_use_one_cell():
    np.testing.assert_array_equal(grid_cells([3.0, 3.0], [1.0, 1.0], 4, 4), [0, 0])


def test_grid_filter_keeps_at_most_n_per_cell():
    kept = grid_filter(COSTS, REWARDS, 2, 2, 2, rng=np.random.default_rng(0))
    assert kept.dtype == np.int64
    assert kept.size == 4
    assert np.all(np.diff(kept) > 0)
    assert set(kept.tolist()) >= {4, 5}  # the sparse cell is untouched
    assert len(set(kept.tolist()) & {0, 1, 2, 3}) == 2


def test_grid_filter_is_reproducible_and_depends_on_the_seed():
    def run(seed: int) -> list[int]:
        return grid_filter(COSTS, REWARDS, 2, 2, 1, rng=np.random.default_rng(seed)).tolist()

    assert run(3) == run(3)
    assert len({tuple(run(seed)) for seed in range(20)}) > 1


def test_grid_filter_keeps_everything_when_no_cell_is_full():
    kept = grid_filter(COSTS, REWARDS, 10, 10, 5, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(kept, np.arange(6))


def test_grid_filter_min_per_cell_drops_sparse_cells():
    kept = grid_filter(COSTS, REWARDS, 2, 2, 2, rng=np.random.default_rng(0), min_per_cell=3)
    assert kept.size == 2
    assert set(kept.tolist()) <= {0, 1, 2, 3}


def test_grid_filter_drops_trajectories_outside_the_ranges():
    rng = np.random.default_rng(0)
    kept = grid_filter(COSTS, REWARDS, 2, 2, 10, rng=rng, reward_range=(5.0, 10.0))
    np.testing.assert_array_equal(kept, [4, 5])


def test_grid_filter_on_no_trajectories_keeps_none():
    assert grid_filter([], [], 3, 3, 1, rng=np.random.default_rng(0)).size == 0


@pytest.mark.parametrize(
    ("bins", "max_per_cell", "min_per_cell"), [((0, 2), 1, 1), ((2, 2), 0, 1), ((2, 2), 1, 0)]
)
def test_grid_filter_rejects_bad_arguments(bins, max_per_cell, min_per_cell):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=">= 1"):
        grid_filter(COSTS, REWARDS, *bins, max_per_cell, rng=rng, min_per_cell=min_per_cell)
