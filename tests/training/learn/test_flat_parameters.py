"""Flat parameters: the same training as one tensor per parameter (learn/flat_parameters.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.training.cdt_synthetic import tiny_config, write_dataset
from training.checkpoint import load_checkpoint
from training.learn.flat_parameters import FlatParameters, flat_optimizer_state
from training.learn.train import train


def small_module() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.LayerNorm(5), nn.Linear(5, 2))


def adamw_steps(module: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=False)
        module(torch.randn(8, 3, generator=generator)).square().sum().backward()
        optimizer.step()


def test_parameters_and_gradients_are_views_of_the_flat_buffers():
    module = small_module()
    before = [p.detach().clone() for p in module.parameters()]
    flat = FlatParameters(module)
    for parameter, value in zip(module.parameters(), before, strict=True):
        torch.testing.assert_close(parameter.detach(), value)
    module(torch.ones(2, 3)).sum().backward()
    assert flat.values.grad is not None and flat.values.grad.abs().sum() > 0
    expected = torch.cat([p.grad.reshape(-1) for p in module.parameters()])  # type: ignore[union-attr]
    torch.testing.assert_close(flat.values.grad, expected)
    with torch.no_grad():
        flat.values.add_(1.0)
    torch.testing.assert_close(next(module.parameters()).detach(), before[0] + 1.0)


def test_adamw_on_the_flat_buffer_takes_the_per_tensor_steps():
    per_tensor, flat_module = small_module(), small_module()
    flat = FlatParameters(flat_module)
    settings = {"lr": 0.05, "weight_decay": 0.1}
    adamw_steps(per_tensor, torch.optim.AdamW(per_tensor.parameters(), **settings), 5)
    adamw_steps(flat_module, torch.optim.AdamW([flat.values], **settings), 5)
    for expected, actual in zip(per_tensor.parameters(), flat_module.parameters(), strict=True):
        torch.testing.assert_close(actual, expected)


def test_a_per_tensor_optimizer_state_continues_on_the_flat_buffer():
    per_tensor = small_module()
    optimizer = torch.optim.AdamW(per_tensor.parameters(), lr=0.05)
    adamw_steps(per_tensor, optimizer, 3)
    resumed = copy.deepcopy(per_tensor)
    flat = FlatParameters(resumed)
    flat_optimizer = torch.optim.AdamW([flat.values], lr=0.05)
    flat_optimizer.load_state_dict(flat_optimizer_state(optimizer.state_dict(), flat))
    adamw_steps(per_tensor, optimizer, 2)
    adamw_steps(resumed, flat_optimizer, 2)
    for expected, actual in zip(per_tensor.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(actual, expected)


def test_an_optimizer_state_of_another_model_is_refused():
    module = small_module()
    optimizer = torch.optim.AdamW(list(module.parameters())[:2], lr=0.05)
    adamw_steps(module, optimizer, 1)
    with pytest.raises(ValueError, match="holds 2 parameters"):
        flat_optimizer_state(optimizer.state_dict(), FlatParameters(small_module()))


def test_the_weight_average_follows_like_averaged_models_ema():
    source, target = small_module(), small_module()
    flat_source, flat_target = FlatParameters(source), FlatParameters(target, gradients=False)
    with torch.no_grad():
        flat_target.values.zero_()
    flat_target.follow(flat_source, decay=0.9, averaged_before=0)  # the first update copies
    torch.testing.assert_close(flat_target.values, flat_source.values)
    with torch.no_grad():
        flat_source.values.add_(1.0)
    flat_target.follow(flat_source, decay=0.9, averaged_before=1)
    torch.testing.assert_close(flat_target.values, flat_source.values - 0.9)


@pytest.mark.parametrize("weight_averaging", [0.0, 0.9])
def test_training_with_flat_parameters_matches_per_tensor_training(
    tmp_path: Path, weight_averaging: float
):
    dataset = write_dataset(tmp_path / "tiny.hdf5")
    weights = []
    for flat in (False, True):
        config = tiny_config(
            dataset, tmp_path / str(flat), update_steps=6, weight_averaging=weight_averaging,
            flat_parameters=flat,
        )  # fmt: skip
        payload = load_checkpoint(train(config))
        weights.append((payload["model"], payload.get("training_model", payload["model"])))
    for per_tensor, flat_weights in zip(*weights, strict=True):
        for name, tensor in per_tensor.items():
            torch.testing.assert_close(flat_weights[name], tensor, atol=1e-6, rtol=1e-5)
