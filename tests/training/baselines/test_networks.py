"""The baselines' networks (training/baselines/networks.py)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from training.baselines.networks import ConditionalVAE, SquashedGaussianActor, mlp


def test_in_place_activations_give_the_gradients_of_out_of_place_ones() -> None:
    torch.manual_seed(0)
    network = mlp(5, (7, 6), 3)
    inputs = torch.randn(11, 5)
    network(inputs).square().sum().backward()
    in_place = [parameter.grad.clone() for parameter in network.parameters()]  # type: ignore[union-attr]
    network.zero_grad()
    hidden = inputs
    linears = [layer for layer in network if isinstance(layer, torch.nn.Linear)]
    for index, layer in enumerate(linears):
        hidden = layer(hidden)
        hidden = F.relu(hidden) if index < len(linears) - 1 else hidden
    hidden.square().sum().backward()
    for got, expected in zip(in_place, network.parameters(), strict=True):
        assert torch.equal(got, expected.grad)  # type: ignore[arg-type]


def test_networks_with_in_place_activations_still_backpropagate() -> None:
    torch.manual_seed(0)
    states, actions = torch.randn(4, 3), torch.rand(4, 2) * 2 - 1
    actor = SquashedGaussianActor(3, 2, (8, 8))
    actor.log_prob(states, actions).sum().backward()
    vae = ConditionalVAE(3, 2, 8)
    vae.loss(states, actions, kl_weight=0.5).backward()
    grads = [p.grad for p in (*actor.parameters(), *vae.parameters())]
    assert all(grad is not None and torch.isfinite(grad).all() for grad in grads)
