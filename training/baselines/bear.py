"""BEAR-Lag and BEAR: bootstrapping error accumulation reduction (Kumar et al., 2019).

A tanh-Gaussian actor maximises Q subject to an MMD support constraint against a VAE of the
behaviour policy; the constraint's weight alpha is learned by dual ascent (log alpha clipped to
[-5, 10]). BEAR-Lag adds lambda * (Q_c - threshold) with the PID multiplier (CDT paper
appendix; OSRL's `osrl/algorithms/bearl.py` at commit 039f775653dcaeeb1a1658a5d040cce468f4ffa6).
The unconstrained `bear` drops the cost critic (the epsilon-reducible study).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from training.baselines.critics import LagrangianCritics
from training.baselines.data import TransitionBatch
from training.baselines.networks import (
    ConditionalVAE,
    SquashedGaussianActor,
    SquashedGaussianHead,
    gaussian_mmd,
    soft_update,
)
from training.baselines.trainer import TrainingContext, adam, step


class BEARLearner(nn.Module):
    """VAE, tanh-Gaussian actor, MMD weight, and the critics (cost critic for BEAR-Lag)."""

    def __init__(self, context: TrainingContext) -> None:
        super().__init__()
        config = self.config = context.config
        state_dim, action_dim = context.data.state_dim, context.data.action_dim
        self.vae = ConditionalVAE(state_dim, action_dim, config.vae_hidden)
        self.actor = SquashedGaussianActor(state_dim, action_dim, config.actor_hidden)
        self.critics = LagrangianCritics(context)
        self.log_alpha = nn.Parameter(torch.zeros(()))
        self.to(config.device)
        self.actor_target = copy.deepcopy(self.actor)
        self.vae_optimiser = adam(self.vae, config.vae_lr)
        self.actor_optimiser = adam(self.actor, config.resolved_actor_lr)
        self.alpha_optimiser = adam([self.log_alpha], config.resolved_scalar_lr)

    def _propose(self, next_states: torch.Tensor) -> torch.Tensor:
        return self.actor_target.sample(next_states)[0]

    def _mmd(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(MMD per state [B], one actor action per state [B, act_dim])."""
        samples, action_dim = self.config.mmd_samples, self.actor.mean.out_features
        repeated = states.repeat_interleave(samples, 0)  # [B * N, obs_dim]
        with torch.no_grad():
            behaviour = self.vae.decode_raw(repeated).reshape(-1, samples, action_dim)
        actions, pre_tanh = self.actor.sample(repeated)  # [B * N, act_dim] each
        pre_tanh = pre_tanh.reshape(-1, samples, action_dim)  # [B, N, act_dim]
        mmd = gaussian_mmd(behaviour, pre_tanh, self.config.mmd_sigma)
        return mmd, actions.reshape(-1, samples, action_dim)[:, 0]

    def _update_actor(self, batch: TransitionBatch) -> dict[str, float]:
        mmd, actions = self._mmd(batch.states)
        objective, stats = self.critics.actor_objective(batch.states, actions)
        constraint = mmd - self.config.mmd_threshold  # [B]
        loss = (objective + self.log_alpha.exp().detach() * constraint).mean()
        stats["actor_loss"] = step(self.actor_optimiser, loss)
        # Dual ascent on alpha: it grows while the MMD exceeds its threshold.
        alpha_loss = -(self.log_alpha.exp() * constraint.detach()).mean()
        step(self.alpha_optimiser, alpha_loss)
        with torch.no_grad():
            self.log_alpha.clamp_(-5.0, 10.0)
        return {
            **stats,
            "mmd": float(mmd.mean().detach()),
            "alpha": float(self.log_alpha.detach().exp()),
        }

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """VAE, critics, actor and alpha, then the actor's target network."""
        vae_loss = self.vae.loss(batch.states, batch.actions, self.config.vae_kl_weight)
        stats = {"vae_loss": step(self.vae_optimiser, vae_loss)}
        stats.update(self.critics.update(batch, self._propose))
        stats.update(self._update_actor(batch))
        soft_update(self.actor_target, self.actor, self.config.tau)
        return stats

    def policy_head(self) -> nn.Module:
        return SquashedGaussianHead(self.actor)
