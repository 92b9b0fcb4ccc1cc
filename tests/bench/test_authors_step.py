"""The matrix-product floor of a training step (bench/authors_step.py)."""

from __future__ import annotations

import pytest
import torch

from bench.authors_step import Side, matrix_product_floor


def test_the_floor_counts_and_times_each_matrix_product_of_a_step() -> None:
    a, b = torch.randn(64, 32), torch.randn(32, 16)
    side = Side("two products", lambda: (a @ b, torch.addmm(torch.zeros(16), a, b)), 0)
    gflop, seconds = matrix_product_floor(side, threads=1, repeats=2)
    assert gflop == pytest.approx(2 * 2 * 64 * 32 * 16 / 1e9)
    assert 0 < seconds < 1
