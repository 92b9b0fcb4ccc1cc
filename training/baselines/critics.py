"""Reward and cost critics with a PID-Lagrangian actor objective, shared by BCQ(-Lag), BEAR(-Lag).

Targets follow BCQ (Fujimoto et al., 2019), as OSRL's BCQ-L and BEAR-L do (liuzuxin/OSRL,
`osrl/algorithms/bcql.py` at commit 039f775653dcaeeb1a1658a5d040cce468f4ffa6): N candidate
actions per next state, the ensemble's mix * min + (1 - mix) * max, the max over candidates.
Deviation: the cost target is masked at terminals like the reward target (OSRL does not mask it).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from training.baselines.data import TransitionBatch
from training.baselines.lagrangian import CostMultiplier, per_step_threshold
from training.baselines.networks import QEnsemble, mixed_target, soft_update
from training.baselines.trainer import TrainingContext, adam, step

ActionProposer = Callable[[torch.Tensor], torch.Tensor]
"""Maps next states [M, obs_dim] to candidate actions [M, act_dim] in [-1, 1]."""


class LagrangianCritics(nn.Module):
    """Q_r and (when constrained) Q_c ensembles, their targets, and the PID multiplier."""

    def __init__(self, context: TrainingContext) -> None:
        super().__init__()
        config = self.config = context.config
        dims = (context.data.state_dim, context.data.action_dim)
        self.critic = QEnsemble(*dims, config.critic_hidden, config.num_critics)
        self.cost_critic = (
            QEnsemble(*dims, config.critic_hidden, config.num_critics)
            if config.constrained
            else None
        )
        self.to(config.device)
        self.critic_target = copy.deepcopy(self.critic)
        self.cost_critic_target = copy.deepcopy(self.cost_critic)
        threshold = per_step_threshold(config.cost_limit, config.gamma, context.episode_len)
        self.multiplier = CostMultiplier(
            threshold * config.cost_scale, config.k_p, config.k_i, config.k_d
        )
        self.critic_optimiser = adam(self.critic, config.resolved_critic_lr)
        self.cost_optimiser = (
            adam(self.cost_critic, config.resolved_critic_lr)
            if self.cost_critic is not None
            else None
        )

    @torch.no_grad()
    def _target(
        self,
        critic: nn.Module,
        signal: torch.Tensor,
        batch: TransitionBatch,
        next_actions: torch.Tensor,
    ) -> torch.Tensor:
        samples = self.config.sample_action_num
        next_states = batch.next_states.repeat_interleave(samples, 0)  # [B * N, obs_dim]
        values = mixed_target(critic(next_states, next_actions), self.config.target_mix)
        best = values.reshape(-1, samples).max(1).values  # [B]
        return signal + self.config.gamma * (1.0 - batch.dones) * best

    def update(self, batch: TransitionBatch, propose: ActionProposer) -> dict[str, float]:
        """One TD step of each critic towards the BCQ-style target, then the soft updates."""
        with torch.no_grad():
            next_states = batch.next_states.repeat_interleave(self.config.sample_action_num, 0)
            next_actions = propose(next_states)  # [B * N, act_dim]
        target = self._target(self.critic_target, batch.rewards, batch, next_actions)
        loss = self.critic.loss(batch.states, batch.actions, target)
        stats = {"critic_loss": step(self.critic_optimiser, loss)}
        soft_update(self.critic_target, self.critic, self.config.tau)
        if (
            self.cost_critic is None
            or self.cost_critic_target is None
            or self.cost_optimiser is None
        ):
            return stats
        target = self._target(self.cost_critic_target, batch.costs, batch, next_actions)
        loss = self.cost_critic.loss(batch.states, batch.actions, target)
        stats["cost_critic_loss"] = step(self.cost_optimiser, loss)
        soft_update(self.cost_critic_target, self.cost_critic, self.config.tau)
        return stats

    def actor_objective(
        self, states: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-state loss [B]: -Q_r plus, when constrained, lambda * (Q_c - threshold).

        The multiplier is updated first from the batch-mean cost estimate (paper appendix).
        """
        loss = -self.critic(states, actions).min(0).values
        if self.cost_critic is None:
            return loss, {}
        cost_values = self.cost_critic(states, actions).min(0).values  # [B]
        estimate = float(cost_values.mean().detach())
        multiplier = self.multiplier.update(estimate)
        loss = loss + multiplier * (cost_values - self.multiplier.threshold)
        return loss, {"cost_estimate": estimate, "multiplier": multiplier}
