"""Costly runs: the stretches of consecutive costly steps in an episode."""

from __future__ import annotations

import numpy as np
import pytest

from bench.costly_runs import costly_runs


@pytest.mark.parametrize(
    ("costs", "runs"),
    [
        ([0, 0, 0], []),
        ([1, 1, 0, 1, 0, 0, 1, 1, 1], [2, 1, 3]),
        ([1, 0, 0, 0.5], [1, 1]),
    ],
)
def test_costly_runs_are_the_stretches_of_consecutive_costly_steps(
    costs: list[float], runs: list[int]
) -> None:
    assert costly_runs(np.array(costs, dtype=np.float32)) == runs
