"""CPQ: constraints penalized Q-learning (Xu et al., 2022).

The cost critic is pushed up on out-of-distribution actions (the policy's samples whose VAE
KL is in the top quarter), weighted by alpha, which rises while their cost estimate is below
`cpq_threshold_scale` times the threshold. The reward critic only bootstraps through next actions
judged safe (Q_c <= threshold), and the actor maximises Q_r on actions judged safe.
Follows OSRL's `osrl/algorithms/cpq.py` (commit 039f775653dcaeeb1a1658a5d040cce468f4ffa6).

Deviations from OSRL: the OOD term uses the current cost critic with gradients (OSRL computes it
under `no_grad` with the target critic, which leaves the term without effect on the loss); OOD
actions are the tanh-squashed policy samples; the cost target is masked at terminals.
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from training.baselines.data import TransitionBatch
from training.baselines.lagrangian import per_step_threshold
from training.baselines.networks import (
    ConditionalVAE,
    QEnsemble,
    SquashedGaussianActor,
    SquashedGaussianHead,
    soft_update,
)
from training.baselines.trainer import TrainingContext, adam, step


class CPQLearner(nn.Module):
    """VAE (OOD detector), tanh-Gaussian actor, reward and cost critics, OOD weight alpha."""

    def __init__(self, context: TrainingContext) -> None:
        super().__init__()
        config = self.config = context.config
        dims = (context.data.state_dim, context.data.action_dim)
        self.vae = ConditionalVAE(*dims, config.vae_hidden)
        self.actor = SquashedGaussianActor(*dims, config.actor_hidden)
        self.critic = QEnsemble(*dims, config.critic_hidden, config.num_critics)
        self.cost_critic = QEnsemble(*dims, config.critic_hidden, config.num_critics)
        self.to(config.device)
        self.critic_target = copy.deepcopy(self.critic)
        self.cost_critic_target = copy.deepcopy(self.cost_critic)
        threshold = per_step_threshold(config.cost_limit, config.gamma, context.episode_len)
        self.threshold = threshold * config.cost_scale
        self.ood_threshold = config.cpq_threshold_scale * self.threshold
        self.alpha = 0.0
        self.optimisers = {
            "vae": adam(self.vae, config.vae_lr),
            "actor": adam(self.actor, config.resolved_actor_lr),
            "critic": adam(self.critic, config.resolved_critic_lr),
            "cost_critic": adam(self.cost_critic, config.resolved_critic_lr),
        }

    def _critic_loss(self, batch: TransitionBatch) -> torch.Tensor:
        with torch.no_grad():
            next_actions, _ = self.actor.sample(batch.next_states)
            values = self.critic_target(batch.next_states, next_actions).min(0).values
            costs = self.cost_critic_target(batch.next_states, next_actions).min(0).values
            safe = (costs <= self.threshold).float()  # [B], the constraints-penalised backup
            target = batch.rewards + self.config.gamma * (1.0 - batch.dones) * safe * values
        return self.critic.loss(batch.states, batch.actions, target)

    def _ood_cost(self, states: torch.Tensor) -> torch.Tensor:
        """Mean cost estimate over OOD policy samples (top-quartile VAE KL), a scalar."""
        samples = self.config.sample_action_num
        repeated = states.repeat_interleave(samples, 0)  # [B * N, obs_dim]
        with torch.no_grad():
            actions, _ = self.actor.sample(repeated)
            kl = self.vae.kl(*self.vae.encode(repeated, actions))  # [B * N]
            out_of_distribution = (kl >= torch.quantile(kl, 0.75)).float()
        cost_values: torch.Tensor = self.cost_critic(repeated, actions).min(0).values  # [B * N]
        weighted = (out_of_distribution * cost_values).reshape(-1, samples)  # [B, N]
        return weighted.mean(1).mean()

    def _cost_critic_loss(self, batch: TransitionBatch) -> torch.Tensor:
        with torch.no_grad():
            next_actions, _ = self.actor.sample(batch.next_states)
            values = self.cost_critic_target(batch.next_states, next_actions).min(0).values
            target = batch.costs + self.config.gamma * (1.0 - batch.dones) * values
        ood_cost = self._ood_cost(batch.states)
        gap = self.ood_threshold - float(ood_cost.detach())
        self.alpha = float(
            np.clip(
                self.alpha + self.config.resolved_scalar_lr * gap, 0.0, self.config.cpq_alpha_max
            )
        )
        td_loss = self.cost_critic.loss(batch.states, batch.actions, target)
        return td_loss - self.alpha * (ood_cost - self.ood_threshold)

    def _actor_loss(self, batch: TransitionBatch) -> torch.Tensor:
        actions, _ = self.actor.sample(batch.states)
        values: torch.Tensor = self.critic(batch.states, actions).min(0).values
        safe = (self.cost_critic(batch.states, actions).min(0).values <= self.threshold).float()
        loss: torch.Tensor = -(safe.detach() * values).mean()
        return loss

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """VAE, reward critic, cost critic (with alpha), actor, then the target networks."""
        vae_loss = self.vae.loss(batch.states, batch.actions, self.config.vae_kl_weight)
        stats = {
            "vae_loss": step(self.optimisers["vae"], vae_loss),
            "critic_loss": step(self.optimisers["critic"], self._critic_loss(batch)),
            "cost_critic_loss": step(self.optimisers["cost_critic"], self._cost_critic_loss(batch)),
            "actor_loss": step(self.optimisers["actor"], self._actor_loss(batch)),
            "alpha": self.alpha,
        }
        soft_update(self.critic_target, self.critic, self.config.tau)
        soft_update(self.cost_critic_target, self.cost_critic, self.config.tau)
        return stats

    def policy_head(self) -> nn.Module:
        return SquashedGaussianHead(self.actor)
