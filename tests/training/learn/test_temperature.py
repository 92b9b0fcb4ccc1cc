"""The learned entropy temperature (training/learn/temperature.py)."""

from __future__ import annotations

import pytest
import torch

from training.learn.temperature import EntropyTemperature


def test_temperature_rises_while_entropy_is_below_target():
    temperature = EntropyTemperature(initial=0.1, target_entropy=-2.0)
    optimiser = torch.optim.SGD(temperature.parameters(), lr=0.1)
    before = float(temperature().detach())
    temperature.set_gradient(torch.tensor(-5.0))
    optimiser.step()
    assert float(temperature().detach()) > before


@pytest.mark.parametrize("entropy", [-5.0, -2.0, 0.7])
def test_temperature_gradient_is_the_one_autograd_gives(entropy: float):
    temperature = EntropyTemperature(initial=0.37, target_entropy=-2.0)
    loss = temperature.log_temperature.exp() * (torch.tensor(entropy) - temperature.target_entropy)
    loss.backward()
    assert temperature.log_temperature.grad is not None
    by_autograd = temperature.log_temperature.grad.clone()
    temperature.set_gradient(torch.tensor(entropy))
    assert torch.equal(temperature.log_temperature.grad, by_autograd)
