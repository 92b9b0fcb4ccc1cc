"""BCQ-Lag and BCQ: batch-constrained Q-learning (Fujimoto et al., 2019), with a PID multiplier.

A conditional VAE models the behaviour policy; a perturbation actor nudges its actions by at
most `perturbation` (phi) towards higher Q. BCQ-Lag adds a cost critic and penalises the actor
with lambda * (Q_c - threshold), lambda from the PID controller (CDT paper appendix; OSRL's
`osrl/algorithms/bcql.py` at commit 039f775653dcaeeb1a1658a5d040cce468f4ffa6). The unconstrained
`bcq` drops the cost critic (the epsilon-reducible study).

Deviation from OSRL: the exported policy decodes the VAE at its latent mean (z = 0) rather than
at a random latent, so the graph is deterministic.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from training.baselines.critics import LagrangianCritics
from training.baselines.data import TransitionBatch
from training.baselines.networks import ConditionalVAE, PerturbationActor, soft_update
from training.baselines.trainer import TrainingContext, adam, step


class BCQHead(nn.Module):
    """Exported BCQ policy: perturb the VAE's action at the latent mean."""

    def __init__(self, vae: ConditionalVAE, actor: PerturbationActor) -> None:
        super().__init__()
        self.vae = vae
        self.actor = actor

    def forward(self, states: torch.Tensor, condition: torch.Tensor) -> tuple[torch.Tensor, None]:
        latent = states.new_zeros((states.shape[0], self.vae.latent_dim))  # [B, latent_dim]
        return self.actor(states, self.vae.decode(states, latent)), None


class BCQLearner(nn.Module):
    """VAE, perturbation actor, and the critics (with a cost critic for BCQ-Lag)."""

    def __init__(self, context: TrainingContext) -> None:
        super().__init__()
        config = self.config = context.config
        state_dim, action_dim = context.data.state_dim, context.data.action_dim
        self.vae = ConditionalVAE(state_dim, action_dim, config.vae_hidden)
        self.actor = PerturbationActor(
            state_dim, action_dim, config.actor_hidden, config.perturbation
        )
        self.critics = LagrangianCritics(context)
        self.to(config.device)
        self.actor_target = copy.deepcopy(self.actor)
        self.vae_optimiser = adam(self.vae, config.vae_lr)
        self.actor_optimiser = adam(self.actor, config.resolved_actor_lr)

    def _propose(self, next_states: torch.Tensor) -> torch.Tensor:
        actions: torch.Tensor = self.actor_target(next_states, self.vae.decode(next_states))
        return actions

    def update(self, batch: TransitionBatch) -> dict[str, float]:
        """VAE, critics, actor, then the actor's target network."""
        vae_loss = self.vae.loss(batch.states, batch.actions, self.config.vae_kl_weight)
        stats = {"vae_loss": step(self.vae_optimiser, vae_loss)}
        stats.update(self.critics.update(batch, self._propose))
        with torch.no_grad():
            candidates = self.vae.decode(batch.states)  # [B, act_dim]
        actions = self.actor(batch.states, candidates)
        loss, actor_stats = self.critics.actor_objective(batch.states, actions)
        stats["actor_loss"] = step(self.actor_optimiser, loss.mean())
        soft_update(self.actor_target, self.actor, self.config.tau)
        return {**stats, **actor_stats}

    def policy_head(self) -> nn.Module:
        return BCQHead(self.vae, self.actor)
