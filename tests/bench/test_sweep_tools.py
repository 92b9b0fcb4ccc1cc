"""The sweep's screening tools: costly runs in a dataset, the summary of `cdt select` results, and
the matrix-product floor of a training step."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.authors_step import Side, matrix_product_floor
from bench.costly_runs import costly_runs
from bench.sweep_summary import scored


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


def _row(budget: float, deterministic: bool, cost: float) -> dict[str, object]:
    return {
        "target_cost": budget, "deterministic": deterministic, "normalised_cost": cost,
        "share_over_budget": 0.1, "normalised_reward": 50.0,
    }  # fmt: skip


def test_sweep_summary_keeps_scale_one_and_ranks_by_the_worst_mean_action_cost(
    tmp_path: Path,
) -> None:
    for run, worst in (("a", 2.0), ("b", 0.8)):
        (tmp_path / run).mkdir()
        entries = [
            {"budget_scale": scale, "step": 4000, "rows": [
                _row(10, True, worst), _row(10, False, 3.0), _row(20, True, 0.5),
                _row(20, False, 0.6),
            ]}
            for scale in (1.0, 0.8)
        ]  # fmt: skip
        (tmp_path / run / "selection.json").write_text(json.dumps(entries))
    found = scored(tmp_path)
    assert len(found) == 2  # the 0.8 scale is left out
    assert [entry.run for entry in sorted(found, key=lambda e: e.worst_mean_cost())] == ["b", "a"]
    assert found[0].budgets[20.0][False]["normalised_cost"] == 0.6


def test_the_floor_counts_and_times_each_matrix_product_of_a_step() -> None:
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    side = Side("two products", lambda: (a @ b, torch.addmm(torch.zeros(16), a, b)), 0)
    gflop, seconds = matrix_product_floor(side, threads=1, repeats=2)
    assert gflop == pytest.approx(2 * 2 * 64 * 32 * 16 / 1e9)
    assert 0 < seconds < 1
