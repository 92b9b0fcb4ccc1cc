"""Training objectives (training/learn/losses.py)."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Normal

from training.data.windows import Batch
from training.learn.losses import gaussian_entropy, gaussian_nll, policy_loss
from training.learn.model import PolicyOutput


def make_batch(actions: torch.Tensor, padding: torch.Tensor) -> Batch:
    batch, seq_len, _ = actions.shape
    zeros = torch.zeros(batch, seq_len)
    return Batch(
        states=torch.zeros(batch, seq_len, 3),
        actions=actions,
        returns_to_go=zeros,
        costs_to_go=zeros,
        time_steps=torch.zeros(batch, seq_len, dtype=torch.long),
        padding_mask=padding,
        costs=torch.tensor([[0.0, 1.0, 0.0]]).expand(batch, seq_len),
    )


def test_gaussian_terms_match_torch_distributions():
    generator = torch.Generator().manual_seed(0)
    mean = torch.randn(4, 3, 2, generator=generator)
    log_std = torch.randn(4, 3, 2, generator=generator)
    actions = torch.randn(4, 3, 2, generator=generator)
    normal = Normal(mean, log_std.exp())
    torch.testing.assert_close(
        gaussian_nll(mean, log_std, actions), -normal.log_prob(actions).sum(-1)
    )
    torch.testing.assert_close(gaussian_entropy(log_std), normal.entropy().sum(-1))


def test_policy_loss_ignores_padding_and_subtracts_weighted_entropy():
    actions = torch.zeros(2, 3, 2)
    padding = torch.tensor([[True, False, False], [False, False, False]])
    mean = torch.zeros(2, 3, 2)
    mean[0, 0] = 100.0  # a huge error, but at a padded position
    log_std = torch.zeros(2, 3, 2)
    output = PolicyOutput(mean, log_std, None)
    terms = policy_loss(
        output, make_batch(actions, padding), stochastic=True, entropy_weight=0.5, cost_weight=0.0
    )
    expected_nll = 2 * 0.5 * torch.log(torch.tensor(2 * torch.pi))
    assert float(terms.nll) == pytest.approx(float(expected_nll), rel=1e-5)
    assert float(terms.loss) == pytest.approx(float(terms.nll - 0.5 * terms.entropy), rel=1e-5)


def test_deterministic_loss_is_the_mean_squared_error():
    actions = torch.ones(1, 3, 2)
    output = PolicyOutput(torch.zeros(1, 3, 2), torch.zeros(1, 3, 2), None)
    padding = torch.zeros(1, 3, dtype=torch.bool)
    terms = policy_loss(
        output, make_batch(actions, padding), stochastic=False, entropy_weight=0.3, cost_weight=0.0
    )
    assert float(terms.loss) == pytest.approx(1.0)
    assert float(terms.entropy) == 0.0


def test_cost_head_loss_is_weighted_binary_cross_entropy():
    logits = torch.tensor([[0.0, 0.0, 0.0]])
    output = PolicyOutput(torch.zeros(1, 3, 2), torch.zeros(1, 3, 2), logits)
    padding = torch.zeros(1, 3, dtype=torch.bool)
    batch = make_batch(torch.zeros(1, 3, 2), padding)
    with_cost = policy_loss(output, batch, stochastic=False, entropy_weight=0.0, cost_weight=0.02)
    without = policy_loss(output, batch, stochastic=False, entropy_weight=0.0, cost_weight=0.0)
    assert float(with_cost.cost_loss) == pytest.approx(float(torch.log(torch.tensor(2.0))))
    assert float(with_cost.loss - without.loss) == pytest.approx(0.02 * float(with_cost.cost_loss))
