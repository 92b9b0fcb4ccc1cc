"""Training objectives of CDT and its ablations (paper section 4.3), as pure torch functions."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from training.data.windows import Batch
from training.learn.model import PolicyOutput

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class LossTerms(NamedTuple):
    """The scalar loss to minimise and the terms it is made of (for logging)."""

    loss: torch.Tensor
    nll: torch.Tensor  # Gaussian negative log-likelihood, or the MSE of deterministic heads
    entropy: torch.Tensor  # policy entropy per step (summed over action dims)
    cost_loss: torch.Tensor  # auxiliary cost-classification loss (0 when unused)


def gaussian_nll(mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """-log N(actions; mean, exp(log_std)^2), summed over the action dims: [..., A] -> [...]."""
    z = (actions - mean) * torch.exp(-log_std)
    return (0.5 * z.square() + log_std + _LOG_SQRT_2PI).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian, summed over the action dims: [..., A] -> [...]."""
    return (log_std + 0.5 + _LOG_SQRT_2PI).sum(-1)


def policy_loss(
    output: PolicyOutput,
    batch: Batch,
    *,
    stochastic: bool,
    entropy_weight: torch.Tensor | float,
    cost_weight: float,
) -> LossTerms:
    """NLL - lambda * entropy (+ cost_weight * cost BCE), averaged over the non-padding steps.

    Deviation: OSRL averages log-probabilities over action dimensions; we sum them (the proper
    log-likelihood of the action vector), so the entropy target -|A| refers to the same quantity.
    The deterministic head is trained with the mean squared error.
    """
    real = ~batch.padding_mask  # [batch, seq_len]
    mean, log_std = output.action_mean.float(), output.action_log_std.float()
    if stochastic:
        nll = gaussian_nll(mean, log_std, batch.actions)[real].mean()
        entropy = gaussian_entropy(log_std)[real].mean()
        loss = nll - entropy_weight * entropy
    else:
        nll = (mean - batch.actions).square().mean(-1)[real].mean()
        entropy = torch.zeros((), device=nll.device)
        loss = nll
    cost_loss = torch.zeros((), device=nll.device)
    if output.cost_logits is not None and cost_weight > 0:
        cost_loss = F.binary_cross_entropy_with_logits(
            output.cost_logits.float()[real], (batch.costs[real] > 0).float()
        )
        loss = loss + cost_weight * cost_loss
    return LossTerms(loss, nll.detach(), entropy.detach(), cost_loss.detach())
