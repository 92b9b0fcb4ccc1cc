"""COptiDICE: offline constrained policy optimisation by stationary distribution correction
estimation (Lee et al., 2022).

nu(s) solves the dual of the f-divergence-regularised LP for the optimal correction
w(s, a) = d_pi / d_D; lambda prices the cost; chi(s) and tau give the cost upper bound within a
KL budget `dice_cost_epsilon`; the policy is extracted by w-weighted maximum likelihood.
Follows OSRL's `osrl/algorithms/coptidice.py` (commit 039f775653dcaeeb1a1658a5d040cce468f4ffa6)
with the soft-chi^2 divergence. Deviation: the policy's likelihood is that of the tanh-Gaussian
(actions mapped back through atanh), where OSRL scores the squashed actions under the pre-tanh
Gaussian.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from training.baselines.data import TransitionBatch
from training.baselines.lagrangian import per_step_threshold
from training.baselines.networks import QEnsemble, SquashedGaussianActor, SquashedGaussianHead
from training.baselines.trainer import TrainingContext, adam, step


def soft_chi_divergence(ratio: torch.Tensor) -> torch.Tensor:
    """f(x): x log x - x + 1 below 1, (x - 1)^2 / 2 above."""
    below = ratio * (torch.log(ratio + 1e-10) - 1.0) + 1.0
    return torch.where(ratio < 1.0, below, 0.5 * (ratio - 1.0).pow(2))


def soft_chi_inverse_derivative(value: torch.Tensor) -> torch.Tensor:
    """(f')^{-1}(y): exp(y) below 0, y + 1 above."""
    return torch.where(value < 0.0, torch.exp(value.clamp(max=0.0)), value + 1.0)


class COptiDICELearner(nn.Module):
    """nu and chi networks, the scalars lambda and tau, and the tanh-Gaussian policy."""

    def __init__(self, context: TrainingContext) -> None:
        super().__init__()
        config = self.config = context.config
        dims = (context.data.state_dim, context.data.action_dim)
        self.actor = SquashedGaussianActor(*dims, config.actor_hidden)
        self.nu = QEnsemble(dims[0], 0, config.critic_hidden, config.num_critics)
        self.chi = QEnsemble(dims[0], 0, config.critic_hidden, config.num_critics)
        self.lambda_raw = nn.Parameter(torch.ones(()))  # lambda = softplus(raw) >= 0
        self.tau_raw = nn.Parameter(torch.ones(()))  # tau = softplus(raw) > 0
        self.to(config.device)
        threshold = per_step_threshold(config.cost_limit, config.gamma, context.episode_len)
        self.threshold = threshold * config.cost_scale
        self.initial_fraction = context.data.initial_fraction
        self.action_std = context.data.tensors.actions.std(0)  # [act_dim]
        critic_lr, scalar_lr = config.resolved_critic_lr, config.resolved_scalar_lr
        self.optimisers = {
            "actor": adam(self.actor, config.resolved_actor_lr),
            "nu": adam(self.nu, critic_lr),
            "chi": adam(self.chi, critic_lr),
            "lambda": adam([self.lambda_raw], scalar_lr),
            "tau": adam([self.tau_raw], scalar_lr),
        }

    def _correction(
        self, batch: TransitionBatch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(nu(s) [B], advantage e_{lambda,nu}(s, a, s') [B], w*(s, a) [B])."""
        nu_states = self.nu(batch.states).min(0).values
        nu_next = self.nu(batch.next_states).min(0).values
        multiplier = F.softplus(self.lambda_raw).detach()
        advantage = batch.rewards - multiplier * batch.costs - nu_states
        advantage = advantage + self.config.gamma * (1.0 - batch.dones) * nu_next
        ratio = F.relu(soft_chi_inverse_derivative(advantage / self.config.dice_alpha))
        return nu_states, advantage, ratio

    def _cost_upper_bound(self, batch: TransitionBatch, ratio: torch.Tensor) -> torch.Tensor:
        """Cost estimate under w (upper bound within the KL budget); steps chi and tau."""
        if self.config.dice_cost_epsilon == 0.0:
            return (ratio * batch.costs).mean()
        gamma, size = self.config.gamma, batch.rewards.shape[0]
        chi_states = self.chi(batch.states).min(0).values
        chi_next = self.chi(batch.next_states).min(0).values
        chi_initial = chi_states * batch.is_initial / self.initial_fraction
        ell = (1.0 - gamma) * chi_initial + ratio * (
            batch.costs + gamma * (1.0 - batch.dones) * chi_next - chi_states
        )
        logits = ell / F.softplus(self.tau_raw).detach()
        weights = torch.softmax(logits, 0) * size
        log_weights = torch.log_softmax(logits, 0) + math.log(size)
        divergence = (weights * log_weights - weights + 1.0).mean().detach()
        step(self.optimisers["chi"], (weights * ell).mean())
        tau_loss = F.softplus(self.tau_raw) * (self.config.dice_cost_epsilon - divergence)
        step(self.optimisers["tau"], tau_loss)
        return (weights.detach() * ratio * batch.costs).mean()

    def _actor_loss(self, batch: TransitionBatch) -> torch.Tensor:
        with torch.no_grad():
            _, _, ratio = self._correction(batch)
        states = batch.states + 0.1 * torch.randn_like(batch.states)  # states are standardised
        actions = batch.actions + 0.1 * self.action_std * torch.randn_like(batch.actions)
        return -(ratio * self.actor.log_prob(states, actions.clamp(-1.0, 1.0))).mean()

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """nu, chi and tau, lambda, then the weighted-likelihood policy step."""
        nu_states, advantage, ratio = self._correction(batch)
        cost_estimate = self._cost_upper_bound(batch, ratio.detach())
        nu_initial = nu_states * batch.is_initial / self.initial_fraction
        nu_loss = (1.0 - self.config.gamma) * nu_initial.mean() + (
            ratio * advantage - self.config.dice_alpha * soft_chi_divergence(ratio)
        ).mean()
        stats = {"nu_loss": step(self.optimisers["nu"], nu_loss)}
        lambda_loss = F.softplus(self.lambda_raw) * (self.threshold - cost_estimate.detach())
        step(self.optimisers["lambda"], lambda_loss)
        stats["actor_loss"] = step(self.optimisers["actor"], self._actor_loss(batch))
        stats["cost_estimate"] = float(cost_estimate.detach())
        stats["multiplier"] = float(F.softplus(self.lambda_raw.detach()))
        return stats

    def policy_head(self) -> nn.Module:
        return SquashedGaussianHead(self.actor)
