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


def test_the_cpu_budget_recipe_sets_the_authors_model_to_the_presets_size(tmp_path) -> None:
    from bench.authors_step import authors_at_cpu_budget, our_config
    from training.learn.config import PRESETS

    preset = PRESETS["cpu-budget"]
    ours = our_config(tmp_path / "data.hdf5", tmp_path, threads=1, recipe="cpu-budget")
    assert (ours.embedding_dim, ours.num_layers, ours.num_heads, ours.seq_len) == (
        preset.embedding_dim, preset.num_layers, preset.num_heads, preset.seq_len,
    )  # fmt: skip
    assert ours.weight_averaging == preset.weight_averaging and ours.eval_every == 0
    theirs = authors_at_cpu_budget()
    assert set(theirs) == {
        "embedding_dim", "num_layers", "num_heads", "seq_len",
        "attention_dropout", "residual_dropout", "embedding_dropout", "loss_cost_weight",
    }  # fmt: skip
    assert (theirs["embedding_dim"], theirs["num_layers"], theirs["num_heads"]) == (
        preset.embedding_dim, preset.num_layers, preset.num_heads,
    )  # fmt: skip
    assert theirs["seq_len"] == preset.seq_len
    assert theirs["residual_dropout"] == theirs["attention_dropout"] == preset.dropout
    assert theirs["loss_cost_weight"] == preset.cost_prediction_weight
